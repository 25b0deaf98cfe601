"""gq api's HTTP endpoints (Starlette): each turns an HTTP request into gq requests to gqd, made
with the caller's token (docs/API.md; the OpenAPI document is gq/api/openapi.py's)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gq import protocol, spec
from gq.api import openapi, stream
from gq.api.guard import InFlight, RateLimit, error_response, token_of
from gq.api.link import HeadLink
from gq.arrays import parse_ref
from gq.config import ApiConfig
from gq.errors import ERRORS_BY_CODE, GqError, RefusedError, TooLarge, UsageError

#: Jobs in a page of GET /v1/jobs when the request names no limit.
DEFAULT_PAGE = 100
#: The spec fields a POST /v1/jobs may give (gqd sets the caller's user, uid and gid).
_SPEC_KEYS = frozenset(f.name for f in spec.FIELDS) - openapi.CALLER_FIELDS | {openapi.WRAP}


class Api:
    """What every endpoint shares: the link to gqd, the limits, the config."""

    def __init__(self, cfg: ApiConfig, link: HeadLink):
        self.cfg, self.link = cfg, link
        self.rate = RateLimit(cfg.rate_per_s, cfg.rate_burst)
        self.in_flight = InFlight(cfg.max_in_flight)
        self.document = openapi.document()

    async def call(self, token: str, msg_type: str, timeout_s: float | None = None,
                   **fields: Any) -> dict[str, Any]:
        """One gq request for the caller whose token this is."""
        with self.in_flight:
            return await self.link.request(token, msg_type, timeout_s, **fields)

    def caller(self, request: Request) -> str:
        """The request's token, once it passed the rate limit."""
        token = token_of(request)
        self.rate.take(token)
        return token

    def routes(self) -> list[Route]:
        ep = self._endpoint
        return [
            Route("/openapi.json", self.openapi_json, methods=["GET"]),
            Route("/v1/healthz", self.healthz, methods=["GET"]),
            Route("/v1/jobs", ep(self.submit), methods=["POST"]),
            Route("/v1/jobs", ep(self.jobs), methods=["GET"]),
            Route("/v1/jobs/{id}", ep(self.job), methods=["GET"]),
            Route("/v1/jobs/{id}", ep(self.cancel), methods=["DELETE"]),
            *(Route(f"/v1/jobs/{{id}}/{verb}", ep(self._action(verb)), methods=["POST"])
              for verb in (protocol.HOLD, protocol.RELEASE, protocol.REQUEUE)),
            Route("/v1/jobs/{id}/output", ep(self.output), methods=["GET"]),
            Route("/v1/nodes", ep(self.nodes), methods=["GET"]),
            Route("/v1/events", ep(self.events), methods=["GET"]),
        ]

    def _endpoint(self, handler: Callable[[Request, str], Any]) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            try:
                return await handler(request, self.caller(request))
            except GqError as exc:
                return error_response(exc)
        return endpoint

    # ------------------------------------------------------------ endpoints

    async def openapi_json(self, request: Request) -> Response:
        return JSONResponse(self.document)

    async def healthz(self, request: Request) -> Response:
        up = self.link.connected
        return JSONResponse({"ok": up, "gqd": up}, status_code=200 if up else 503)

    async def submit(self, request: Request, token: str) -> Response:
        body = await _body(request, self.cfg.max_body_bytes)
        items = body if isinstance(body, list) else [body]
        if not items:
            raise UsageError("nothing to submit: give a job spec or a list of them")
        if len(items) > self.cfg.max_jobs_per_submit:
            raise TooLarge(f"too large: {len(items)} job specs in one request, over the "
                           f"{self.cfg.max_jobs_per_submit} of [api] max_jobs_per_submit")
        specs = [_spec(item, n) for n, item in enumerate(items)]
        reply = await self.call(token, protocol.SUBMIT, jobs=specs)
        return JSONResponse({"ids": reply["ids"]}, status_code=201)

    async def jobs(self, request: Request, token: str) -> Response:
        q = _Query(request)
        limit = q.integer("limit", 1, self.cfg.max_page) or DEFAULT_PAGE
        fields: dict[str, Any] = {"after": q.integer("cursor", 0, 2**63 - 1) or 0,
                                  "limit": limit, "all": q.flag("all"),
                                  "user": q.text("user")}
        if (states := q.text("state")) is not None:
            from gq.cli.query import states as state_names
            fields["states"] = state_names(states)
        qos, name, array = q.text("qos"), q.text("name"), q.integer("array", 1, 2**63 - 1)
        reply = await self.call(token, protocol.QUEUE, **fields)
        jobs = [j for j in reply["jobs"] if (qos is None or j["qos"] == qos)
                and (name is None or j["name"] == name)
                and (array is None or j["array_job_id"] == array)]
        cursor = reply.get("next")
        return JSONResponse({"jobs": jobs, "next_cursor": None if cursor is None else str(cursor)})

    async def job(self, request: Request, token: str) -> Response:
        reply = await self.call(token, protocol.SHOW, id=_job_ref(request))
        return JSONResponse(reply["job"])

    async def cancel(self, request: Request, token: str) -> Response:
        q = _Query(request)
        ref = _job_ref(request)
        signal = q.text("signal")
        extra: dict[str, Any] = {} if signal is None else {"signal": signal,
                                                           "batch_only": q.flag("batch")}
        reply = await self.call(token, protocol.CANCEL, ids=[ref], **extra)
        return _done(ref, reply["cancelled"], reply)

    def _action(self, verb: str) -> Callable[[Request, str], Any]:
        async def action(request: Request, token: str) -> Response:
            ref = _job_ref(request)
            reply = await self.call(token, verb, ids=[ref])
            return _done(ref, reply["done"], reply)
        return action

    async def output(self, request: Request, token: str) -> Response:
        q = _Query(request)
        which = q.choice("stream", ("stdout", "stderr")) or "stdout"
        offset = q.integer("offset", 0, 2**63 - 1) or 0
        ref = _job_ref(request)
        job = (await self.call(token, protocol.SHOW, id=ref))["job"]

        async def show() -> dict[str, Any]:
            return (await self.call(token, protocol.SHOW, id=ref))["job"]
        return await stream.output(job, which, offset, q.flag("follow"), show)

    async def nodes(self, request: Request, token: str) -> Response:
        return JSONResponse({"nodes": (await self.call(token, protocol.NODES))["nodes"]})

    async def events(self, request: Request, token: str) -> Response:
        q = _Query(request)
        since = q.integer("since", 0, 2**63 - 1)
        if (last_id := request.headers.get("last-event-id", "").strip()):
            if not last_id.isdigit() or len(last_id) > 18:
                raise UsageError(f"bad Last-Event-ID {last_id!r}: expected an event's seq")
            since = int(last_id)
        kind = q.choice("kind", ("job", "node"))
        filters: dict[str, Any] = {
            "user": q.text("user"), "job": q.integer("job", 1, 2**63 - 1),
            "array": q.integer("array", 1, 2**63 - 1), "kinds": [kind] if kind else None}
        limit = q.integer("limit", 1, 10_000)
        first = await self.call(token, protocol.EVENTS, since=since, **filters,
                                **({"limit": limit} if limit else {}))
        if "text/event-stream" not in request.headers.get("accept", ""):
            return JSONResponse(first)

        async def more(cursor: int, park_s: float) -> dict[str, Any]:
            return await self.call(token, protocol.EVENTS, timeout_s=park_s + self.cfg.timeout_s,
                                   since=cursor, park_s=park_s, **filters)
        return stream.events(first, more)


class _Query:
    """A request's query parameters, each read as its type or UsageError naming it."""

    def __init__(self, request: Request):
        self.params = request.query_params

    def text(self, name: str) -> str | None:
        value = self.params.get(name)
        if value is not None and (len(value) > protocol.MAX_STR or "\0" in value):
            raise UsageError(f"bad {name}: too long or with a NUL")
        return value

    def integer(self, name: str, low: int, high: int) -> int | None:
        value = self.params.get(name)
        if value is None:
            return None
        if not value.isdigit() or not low <= int(value) <= high:
            raise UsageError(f"bad {name} {value!r}: expected a whole number {low}..{high}")
        return int(value)

    def flag(self, name: str) -> bool:
        value = self.params.get(name, "false").lower()
        if value not in ("1", "true", "0", "false", "yes", "no"):
            raise UsageError(f"bad {name} {value!r}: expected true or false")
        return value in ("1", "true", "yes")

    def choice(self, name: str, choices: tuple[str, ...]) -> str | None:
        value = self.params.get(name)
        if value is not None and value not in choices:
            raise UsageError(f"bad {name} {value!r}: expected {' or '.join(choices)}")
        return value


def _job_ref(request: Request) -> int | str:
    raw = request.path_params["id"]
    if not raw.replace("_", "").isdigit() or len(raw) > 30:
        raise UsageError(f"bad job id {raw!r}: expected 123 or 123_7")
    ref = parse_ref(raw)
    if isinstance(ref, int) and not 1 <= ref < 2**63:
        raise UsageError(f"bad job id {raw!r}: expected 123 or 123_7")
    return ref


def _done(ref: int | str, done: list[Any], reply: dict[str, Any]) -> Response:
    """An action's reply on one job: 200, or the job's refusal with its own code."""
    if done:
        return JSONResponse({"done": [str(ref)]})
    key = str(ref)
    cls = ERRORS_BY_CODE.get(reply.get("error_codes", {}).get(key, ""), RefusedError)
    raise cls(reply.get("errors", {}).get(key, f"job {ref}: refused"))


async def _body(request: Request, limit: int) -> Any:
    """The request's JSON body, read up to `limit` bytes (TooLarge past it)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise TooLarge(f"too large: a body of {declared} bytes, over the {limit} of "
                       "[api] max_body_bytes")
    parts, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise TooLarge(f"too large: a body over the {limit} bytes of [api] max_body_bytes")
        parts.append(chunk)
    try:
        return json.loads(b"".join(parts))
    except ValueError as exc:
        raise UsageError(f"the body is not JSON: {exc}") from None


def _spec(item: Any, n: int) -> dict[str, Any]:
    """A JobSpec of the API (gq/api/openapi.py) as gqd takes it; gqd checks its values."""
    where = f"job spec {n}" if n else "job spec"
    if not isinstance(item, dict):
        raise UsageError(f"{where} is not a JSON object")
    unknown = sorted(set(item) - _SPEC_KEYS)
    if unknown:
        raise UsageError(f"{where}: unknown field {unknown[0]!r}; the fields are those of "
                         "JobSpec (GET /openapi.json)")
    out = dict(item)
    wrap = out.pop(openapi.WRAP, None)
    if (wrap is None) == ("script" not in out):
        raise UsageError(f"{where}: give script (starting with #!) or wrap (a shell command), "
                         "not both")
    if wrap is not None:
        if not isinstance(wrap, str):
            raise UsageError(f"{where}: wrap must be a string")
        out["script"] = f"#!/bin/sh\n{wrap}\n"
        out.setdefault("name", "wrap")
    if "cwd" not in out:
        raise UsageError(f"{where}: give cwd, the job's working directory on the nodes")
    if not str(out["script"]).startswith("#!"):
        raise UsageError(f"{where}: a script must start with #! (or give wrap)")
    return out


def make(cfg: ApiConfig, link: HeadLink) -> Starlette:
    """The ASGI app; the link to gqd starts and stops with it."""
    api = Api(cfg, link)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await link.start()
        try:
            yield
        finally:
            await link.close()

    return Starlette(routes=api.routes(), lifespan=lifespan,
                     exception_handlers={404: _not_found, 405: _not_allowed})


async def _not_found(request: Request, exc: Exception) -> Response:
    return JSONResponse({"error": {"code": "not_found", "message": f"no such endpoint: "
                                   f"{request.url.path} (see /openapi.json)"}}, status_code=404)


async def _not_allowed(request: Request, exc: Exception) -> Response:
    return JSONResponse({"error": {"code": "usage", "message": f"{request.method} is not "
                                   f"allowed on {request.url.path}"}}, status_code=405)
