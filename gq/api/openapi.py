"""gq api's OpenAPI document, served at /openapi.json and kept in the repo (docs/openapi.json).

The job spec's schema (`JobSpec`) is made here from gq/spec.py's FIELDS and OPTIONS, the one
declaration the CLI's options and the protocol's schema come from too: a field added there is in
the API at once, with its type, bounds, default and the help of the option that sets it. The
fields gqd sets from the caller (user, uid, gid) are left out. Regenerate the kept copy with
`python -m gq.api.openapi > docs/openapi.json` (tests/test_api_schema.py checks it is current).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from gq import events, spec
from gq.errors import ERRORS_BY_CODE
from gq.model import JobState, NodeState
from gq.protocol import MAX_SCRIPT, MAX_STR

#: Spec fields gqd fills in from the caller: not the API's to send.
CALLER_FIELDS = frozenset({"user", "uid", "gid"})
#: What the API adds to a spec: a shell command instead of a script (`gq submit --wrap`).
WRAP = "wrap"
#: HTTP status of each error code (gq/errors.py), and of the API's own refusals.
STATUS = {"usage": 400, "protocol": 400, "config": 400, "unauthenticated": 401,
          "permission_denied": 403, "not_found": 404, "refused": 409, "gone": 410,
          "too_large": 413, "rate_limited": 429, "store": 503, "unreachable": 503,
          "error": 500}
_JOB_REF = {"type": "string", "pattern": r"^[0-9]{1,18}(_[0-9]{1,9})?$",
            "description": "a job id, or ARRAYID_INDEX for one task of an array"}
_NULL_STR = {"type": "string", "nullable": True}
_NULL_INT = {"type": "integer", "nullable": True}


def _help() -> dict[str, str]:
    """Each field's help: that of the first option setting it alone, else of the first setting
    it with others (`-g [TYPE:]N` sets gpus and gpu_type; `--gpu-type` gpu_type alone)."""
    out: dict[str, str] = {}
    for option in sorted(spec.OPTIONS, key=lambda o: len(o.fields) > 1):  # a stable sort
        for name in option.fields:
            out.setdefault(name, option.help)
    return out


def field_schema(field: spec.Field) -> dict[str, Any]:
    """One spec field as a JSON schema (OpenAPI 3.0)."""
    kinds = [t for t in field.types if t is not spec.NONE]
    out: dict[str, Any]
    if kinds == [str]:
        out = {"type": "string", "maxLength": MAX_SCRIPT if field.name == "script" else MAX_STR}
    elif kinds == [bool]:
        out = {"type": "boolean"}
    elif kinds == [int]:
        out = {"type": "integer"}
    elif int in kinds and float in kinds:
        out = {"type": "number"}
    elif kinds == [list]:
        out = {"type": "array", "items": {"type": "string", "maxLength": MAX_STR}}
    elif kinds == [dict]:
        out = {"type": "object", "additionalProperties": {"type": "string"}}
    else:  # pragma: no cover - a new kind of field must be described here first
        raise TypeError(f"no JSON schema for spec field {field.name} of {field.types}")
    if field.bounds is not None:
        out["minimum"], out["maximum"] = field.bounds
    if spec.NONE in field.types:
        out["nullable"] = True
    if not field.required:
        out["default"] = field.default
    text = _help().get(field.name)
    if field.unit:
        text = f"{text or field.name} ({field.unit})"
    if field.filled:
        text = f"{text or field.name}; null: gqd's default"
    if text:
        out["description"] = text
    return out


def job_spec_schema() -> dict[str, Any]:
    props = {f.name: field_schema(f) for f in spec.FIELDS if f.name not in CALLER_FIELDS}
    props[WRAP] = {"type": "string", "maxLength": MAX_SCRIPT,
                   "description": "a shell command to run instead of a script (gq submit "
                                  "--wrap); give script or wrap, not both"}
    props["cwd"]["description"] = "the job's working directory, absolute, on the nodes"
    return {"type": "object", "required": ["cwd"], "additionalProperties": False,
            "properties": props,
            "description": "A job, as gq submit's options make one (gq/spec.py): durations in "
                           "seconds, sizes in bytes, times in epoch seconds; the job runs as "
                           "the token's user, with exactly the environment `env` gives."}


def _job_schema() -> dict[str, Any]:
    states = [s.value for s in JobState]
    props: dict[str, Any] = {
        "id": {"type": "integer"}, "job_id": {"type": "string"}, "name": {"type": "string"},
        "user": {"type": "string"}, "state": {"type": "string", "enum": states},
        "reason": {"type": "string"}, "qos": _NULL_STR, "priority": {"type": "number"},
        "nodes": {"type": "integer"}, "gpus_per_node": {"type": "integer"},
        "gpu_type": _NULL_STR, "time_limit_s": _NULL_INT, "submit_time": _NULL_STR,
        "start_time": _NULL_STR, "end_time": _NULL_STR, "exit_code": _NULL_INT,
        "node_list": {"type": "array", "items": {"type": "string"}},
        "array_job_id": _NULL_INT, "array_index": _NULL_INT, "hold": _NULL_STR,
        "restart_count": {"type": "integer"}, "work_dir": {"type": "string"},
        "stdout": {"type": "string"}, "stderr": {"type": "string"},
    }
    return {"type": "object", "required": ["id", "job_id", "name", "user", "state"],
            "properties": props, "additionalProperties": True,
            "description": "A job's record: the fields of `gq show --json` (man gq, JSON "
                           "OUTPUT); times are ISO 8601 UTC."}


def _event_schema() -> dict[str, Any]:
    return {"type": "object", "required": ["seq", "time", "kind", "state"],
            "additionalProperties": False,
            "description": "A job's or a node's state change (gq/events.py): job events have "
                           "the job fields, node events node and reason.",
            "properties": {
                "seq": {"type": "integer", "minimum": 1}, "time": {"type": "number"},
                "kind": {"type": "string", "enum": list(events.KINDS)},
                "state": {"type": "string"}, "reason": {"type": "string"},
                "node": {"type": "string"}, "id": {"type": "integer"},
                "job_id": {"type": "string"}, "array_job_id": _NULL_INT,
                "array_index": _NULL_INT, "user": {"type": "string"}, "uid": {"type": "integer"},
                "exit_code": _NULL_INT, "restart_count": {"type": "integer"},
                "hold": {"type": "string"}}}


def _node_schema() -> dict[str, Any]:
    return {"type": "object", "required": ["name", "state"], "additionalProperties": True,
            "properties": {"name": {"type": "string"},
                           "state": {"type": "string", "enum": [s.value for s in NodeState]},
                           "reason": {"type": "string"}, "addr": {"type": "string"},
                           "cpus": {"type": "integer"}, "mem": {"type": "integer"},
                           "last_seen": _NULL_STR, "telemetry_stale": {"type": "boolean"},
                           "jobs": {"type": "array", "items": {"type": "integer"}},
                           "gpus": {"type": "array", "items": {"type": "object"}}}}


def _error_schema() -> dict[str, Any]:
    codes = sorted({*(c.code for c in ERRORS_BY_CODE.values()), *STATUS})
    return {"type": "object", "required": ["error"], "properties": {"error": {
        "type": "object", "required": ["code", "message"],
        "properties": {"code": {"type": "string", "enum": codes},
                       "message": {"type": "string",
                                   "description": "the CLI's wording for the same refusal"}}}}}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], text: str) -> dict[str, Any]:
    return {"description": text, "content": {"application/json": {"schema": schema}}}


#: The error responses every authenticated operation may give.
_ERRORS = {"400": "bad input: the CLI's usage error", "401": "no token, or an unknown, revoked "
           "or expired one", "403": "another user's job, or a read-only token",
           "404": "no such job", "409": "refused: the job is not in a state for it",
           "410": "the events asked for are no longer kept",
           "413": "the body or its list is too large", "429": "over the token's rate limit "
           "(see Retry-After)", "503": "gqd cannot be reached or cannot save now"}


def _op(summary: str, ok: dict[str, Any], *, params: list[dict[str, Any]] | None = None,
        body: dict[str, Any] | None = None, status: str = "200",
        public: bool = False) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "responses": {status: ok}}
    if params:
        op["parameters"] = params
    if body:
        op["requestBody"] = body
    if public:
        op["security"] = []
    else:
        op["responses"].update({k: {"$ref": f"#/components/responses/E{k}"} for k in _ERRORS})
    return op


def _q(name: str, schema: dict[str, Any], text: str, where: str = "query") -> dict[str, Any]:
    return {"name": name, "in": where, "required": where == "path", "schema": schema,
            "description": text}


_ID = _q("id", _JOB_REF, "the job", "path")
_DONE = _json({"type": "object", "required": ["done"], "properties": {"done": {
    "type": "array", "items": {"type": "string"}}}}, "done: the job (an array: its tasks)")


def document() -> dict[str, Any]:
    """The whole OpenAPI document."""
    action = {verb: {"post": _op(f"{verb.capitalize()} a job (gq {verb}); an array's id: all its "
                                 "tasks", _DONE, params=[_ID])}
              for verb in ("hold", "release", "requeue")}
    paths: dict[str, Any] = {
        "/v1/healthz": {"get": _op("Whether gq api is up and connected to gqd (no token)", _json(
            {"type": "object", "required": ["ok", "gqd"], "properties": {
                "ok": {"type": "boolean"}, "gqd": {"type": "boolean"}}}, "up"),
            public=True)},
        "/v1/jobs": {
            "post": _op("Submit one job or a list (all or none), arrays included", _json(
                {"type": "object", "required": ["ids"], "properties": {"ids": {
                    "type": "array", "items": {"type": "integer"}}}},
                "the new jobs' ids (an array's: its first task's), in order"),
                status="201", body={"required": True, "content": {"application/json": {
                    "schema": {"oneOf": [_ref("JobSpec"), {
                        "type": "array", "minItems": 1, "items": _ref("JobSpec")}]}}}}),
            "get": _op("List pending and running jobs, oldest first, a page at a time", _json(
                {"type": "object", "required": ["jobs", "next_cursor"], "properties": {
                    "jobs": {"type": "array", "items": _ref("Job")},
                    "next_cursor": _NULL_STR}}, "a page; next_cursor: ask with it for the "
                "next (null: none)"), params=[
                _q("state", {"type": "string"}, "only these states (comma list)"),
                _q("user", {"type": "string"}, "only this user's (admins; others: their own)"),
                _q("qos", {"type": "string"}, "only this QOS's"),
                _q("name", {"type": "string"}, "only jobs of this name"),
                _q("array", {"type": "integer", "minimum": 1}, "only this array's tasks"),
                _q("all", {"type": "boolean"}, "with jobs that ended in the last 5 minutes"),
                _q("cursor", {"type": "string", "pattern": "^[0-9]{1,18}$"},
                   "next_cursor of the page before"),
                _q("limit", {"type": "integer", "minimum": 1},
                   "jobs per page (default 100, at most [api] max_page)")])},
        "/v1/jobs/{id}": {
            "get": _op("Everything about one job, running or long ended",
                       _json(_ref("Job"), "the job"), params=[_ID]),
            "delete": _op("Cancel a job (gq cancel); with signal, only signal it", _DONE,
                          params=[_ID, _q("signal", {"type": "string", "maxLength": 32},
                                          "send this signal (USR1, TERM ...) instead; the job "
                                          "goes on"),
                                  _q("batch", {"type": "boolean"},
                                     "with signal: to the job's script only")])},
        **{f"/v1/jobs/{{id}}/{verb}": op for verb, op in action.items()},
        "/v1/jobs/{id}/output": {"get": _op(
            "The job's output file, as the API host reads it (follow: until the job ends)",
            {"description": "its bytes from offset", "content": {"text/plain": {
                "schema": {"type": "string"}}}},
            params=[_ID, _q("follow", {"type": "boolean"}, "stream it until the job ends"),
                    _q("stream", {"type": "string", "enum": ["stdout", "stderr"]},
                       "which file (default stdout)"),
                    _q("offset", {"type": "integer", "minimum": 0}, "from this byte on")])},
        "/v1/nodes": {"get": _op("Nodes, their GPUs and the jobs holding them", _json(
            {"type": "object", "required": ["nodes"], "properties": {
                "nodes": {"type": "array", "items": _ref("Node")}}}, "the nodes"))},
        "/v1/events": {"get": _op(
            "Job and node events after a sequence number: Server-Sent Events (Accept: "
            "text/event-stream; resumable with Last-Event-ID), or one JSON page",
            {"description": "SSE: `id: SEQ`, `event: job|node`, `data: EVENT`; JSON: a page",
             "content": {"text/event-stream": {"schema": {"type": "string"}},
                         "application/json": {"schema": {
                             "type": "object", "required": ["events", "next", "first", "last"],
                             "properties": {"events": {"type": "array", "items": _ref("Event")},
                                            "next": {"type": "integer"},
                                            "first": {"type": "integer"},
                                            "last": {"type": "integer"}}}}}},
            params=[_q("since", {"type": "integer", "minimum": 0},
                       "events after this seq (default: from now on; Last-Event-ID wins)"),
                    _q("user", {"type": "string"}, "only this user's jobs' (admins)"),
                    _q("job", {"type": "integer", "minimum": 1}, "only this job's"),
                    _q("array", {"type": "integer", "minimum": 1}, "only this array's tasks'"),
                    _q("kind", {"type": "string", "enum": list(events.KINDS)}, "only these"),
                    _q("limit", {"type": "integer", "minimum": 1, "maximum": 10_000},
                       "most events per JSON page (default 1000)"),
                    _q("Last-Event-ID", {"type": "string", "pattern": "^[0-9]{1,18}$"},
                       "resume after this seq (what EventSource sends)", "header")])},
    }
    return {
        "openapi": "3.0.3",
        "info": {"title": "gq api", "version": "1",
                 "description": "gq's HTTP API (docs/API.md): jobs, nodes and events of one "
                                "cluster, as the token's user. Errors are "
                                "{\"error\": {\"code\", \"message\"}} with the CLI's wording."},
        "paths": paths,
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                           "description": "a token from `gq token create`"}},
            "schemas": {"JobSpec": job_spec_schema(), "Job": _job_schema(),
                        "Event": _event_schema(), "Node": _node_schema(),
                        "Error": _error_schema()},
            "responses": {f"E{k}": _json(_ref("Error"), text) for k, text in _ERRORS.items()}},
        "security": [{"bearer": []}],
    }


def text() -> str:
    """The document as kept in docs/openapi.json."""
    return json.dumps(document(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    sys.stdout.write(text())
