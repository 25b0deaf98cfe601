"""The Python API to gqd that the CLI uses; also usable from notebooks and scripts.

    from gq.client import Client, wrap
    with Client() as c:                          # the cluster `gq` would talk to
        (job_id,) = c.submit([wrap("python train.py", gpus=2, time_limit_s=3600)])
        c.show(job_id)["state"]                  # 'PENDING', 'RUNNING', ...
        (done,) = c.wait([job_id])               # blocks; the final record
        done["exit_code"]

Jobs come back as the dicts `gq show --json` prints (docs/API.md, man gq(1) JSON OUTPUT).
Errors are `gq.errors.GqError` kin: `UnreachableError` (no head), `NotFoundError`,
`PermissionDenied`, `UsageError`, `RefusedError`.
"""

from __future__ import annotations

import itertools
import os
import pwd
import time
from collections.abc import Iterator, Sequence

from gq import configfile, defaults, gcpause, protocol, zmtp
from gq.errors import ERRORS_BY_CODE, GqError, ProtocolError, UnreachableError, UsageError

TYPE_CHECKING = False  # typing is not imported for `gq submit` and `gq show`
if TYPE_CHECKING:  # neither gq.model's nor gq.config's dataclasses are loaded for the CLI
    from typing import Any

    from gq.config import Config
    from gq.model import JobSpec

#: How long to wait for a connection to the head before calling it unreachable, in seconds.
CONNECT_TIMEOUT_S = 3.0
START_HINT = "start a personal cluster with `gq up`, or point GQ_CONFIG at your cluster's config"


def wrap(command: str, **options: Any) -> JobSpec:
    """A job running the shell `command` as `gq submit --wrap` would: in the current directory
    with this process's environment; `options` are JobSpec fields (gpus, nodes, time_limit_s,
    qos, name, output, array, dependency, ...)."""
    options.setdefault("name", "wrap")
    options.setdefault("cwd", os.getcwd())
    options.setdefault("env", dict(os.environ))
    from gq.model import JobSpec
    return JobSpec(script=f"#!/bin/sh\n{command}\n", **options)


class Client:
    """One connection to gqd. `cfg` defaults to the config `gq` finds (GQ_CONFIG, the running
    personal cluster, /etc/gq/gq.toml), of which it reads only [client] and [head]
    client_endpoints (gq.configfile); `timeout_s` bounds each reply (GQ_TIMEOUT, else
    [client] timeout_s). Use it as a context manager, or call close()."""

    def __init__(self, cfg: Config | configfile.ClientSettings | None = None,
                 timeout_s: float | None = None):
        if cfg is None:
            cfg = configfile.client_settings()
        elif not isinstance(cfg, configfile.ClientSettings):
            cfg = configfile.ClientSettings(cfg.path, cfg.client_endpoints(), cfg.client.timeout_s)
        self.cfg = cfg
        self.timeout_s = timeout_s if timeout_s is not None else float(
            os.environ.get("GQ_TIMEOUT", self.cfg.timeout_s))
        self.endpoint = self._choose_endpoint()
        self._conn: zmtp.Dealer | None = None
        self._rids = itertools.count(int.from_bytes(os.urandom(3), "big"))
        self._uid = os.getuid()
        self._user = _user_name(self._uid)

    def _choose_endpoint(self) -> str:
        """The first endpoint that can work: an ipc socket must exist; TCP is tried as is."""
        endpoints = self.cfg.client_endpoints()
        if forced := os.environ.get("GQ_ENDPOINT"):
            # A job's: gqnode's relay on its host, which vouches for the job's owner.
            endpoints = [forced]
        elif not self.cfg.path:
            # No config file anywhere: only a gqd on this host (its default ipc socket) can be
            # meant; waiting on the default TCP port would only delay "no head" by a timeout.
            endpoints = [ep for ep in endpoints if ep.startswith("ipc://")]
        for ep in endpoints:
            if not ep.startswith("ipc://") or os.path.exists(ep[len("ipc://"):]):
                return ep
        raise UnreachableError(f"no gq head is running here (no socket at "
                               f"{', '.join(endpoints) or 'any endpoint'}): {START_HINT}")

    def _connection(self) -> zmtp.Dealer:
        """The connection to gqd (gq/zmtp.py: no libzmq to load for one request), made anew
        when the head closed the last one (it restarted): pyzmq's DEALER reconnected too."""
        if self._conn is not None and self._conn.peer_closed():
            self.close()
        if self._conn is None:
            self._conn = zmtp.Dealer(self.endpoint, CONNECT_TIMEOUT_S,
                                     f"cannot connect to the gq head at {self.endpoint}: "
                                     f"{START_HINT}")
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ requests

    def request(self, msg_type: str, timeout_s: float | None = None, **fields: Any
                ) -> dict[str, Any]:
        """Send one request and return the reply's data; errors come back as GqError kin."""
        rid = next(self._rids)
        payload = protocol.encode(msg_type, rid=rid, claim_uid=self._uid,
                                  claim_user=self._user, **fields)
        if len(payload) > defaults.MAX_MESSAGE_BYTES:  # gqd would drop the connection
            raise UsageError(f"the {msg_type} request is {len(payload)} bytes, over gq's "
                             f"{defaults.MAX_MESSAGE_BYTES}-byte message limit: send fewer "
                             "jobs per request (an array of many tasks is one job)")
        conn = self._connection()
        deadline = time.monotonic() + (timeout_s if timeout_s is not None else self.timeout_s)
        try:
            conn.send(payload, deadline - time.monotonic())
            while (left := deadline - time.monotonic()) > 0:
                frame = conn.recv(left)
                if frame is None:
                    break
                # A view, not bytes(frame): a reply page may be megabytes, not worth a copy.
                reply = protocol.decode(memoryview(frame), frozenset({protocol.REPLY}))
                if reply["rid"] != rid:
                    continue  # a late answer to an earlier request that timed out
                if not reply["ok"]:
                    cls = ERRORS_BY_CODE.get(reply.get("code", ""), GqError)
                    raise cls(str(reply.get("error", "request refused")))
                return {k: v for k, v in reply.items() if k not in ("v", "type", "rid", "ok")}
        except zmtp.Closed:
            self.close()
            raise UnreachableError(self._closed(len(payload))) from None
        except TimeoutError:
            pass  # the head took nothing of the request: as no answer
        # The request may still be handled; a new connection keeps a late reply from
        # confusing us.
        self.close()
        raise UnreachableError(f"gq head at {self.endpoint} did not answer within "
                               f"{self.timeout_s:g}s: {START_HINT}")

    def _closed(self, size: int) -> str:
        """Why gqd may have closed the connection with our request unanswered."""
        why = "it may have restarted; try again"
        if self.endpoint.startswith("tcp://") and size > defaults.MAX_TCP_REQUEST_BYTES:
            why = (f"a request over TCP may be at most {defaults.MAX_TCP_REQUEST_BYTES} bytes "
                   f"(this one is {size}); use the head's ipc socket")
        return f"the gq head at {self.endpoint} closed the connection without answering: {why}"

    def ping(self) -> dict[str, Any]:
        """The head's protocol version and who it takes the caller for (user, uid, proven, and
        via: the relay or node that vouched for the caller, "" when none did)."""
        return self.request(protocol.PING)

    def submit(self, specs: list[JobSpec] | list[dict[str, Any]]) -> list[int]:
        """Queue jobs (all or none, one commit); their ids, an array's being its first task's.
        The head sets each job's user, uid and gid from the caller (see `wrap`). A spec may
        also be given in its wire form, `JobSpec.to_dict()`'s (as `gq submit` builds it)."""
        return list(self.submit_reply(specs)["ids"])

    def submit_reply(self, specs: list[JobSpec] | list[dict[str, Any]]) -> dict[str, Any]:
        """`submit`'s whole reply: `ids`, and `warnings` (what gqd accepted but will not do
        as asked, one line each), when there are any."""
        if len(specs) > defaults.MAX_SUBMIT_SPECS:
            raise UsageError(f"a submit may carry at most {defaults.MAX_SUBMIT_SPECS} jobs, not "
                             f"{len(specs)}: send several (an array of many tasks is one job)")
        return self.request(protocol.SUBMIT, jobs=[
            s if isinstance(s, dict) else s.to_dict() for s in specs])

    def test_submit(self, spec: JobSpec | dict[str, Any]) -> dict[str, Any]:
        """sbatch --test-only: accept nothing, but say when and where the job would start as
        the queue stands: `start` (ISO time, None when the scheduler cannot tell), `nodes`,
        `cpus`, `gpus`, `partition` and `reason`."""
        return self.request(protocol.TEST_SUBMIT,
                            job=spec if isinstance(spec, dict) else spec.to_dict())

    def cancel(self, ids: list[int | str], signal: str | None = None,
               batch_only: bool = False, filter: dict[str, Any] | None = None  # noqa: A002
               ) -> dict[str, Any]:
        """Cancel jobs (`123`, a whole array by its id, or one task as `"123_7"`); the reply has
        `cancelled` and `errors` (id -> why not). With `signal` ("USR1"), send it to the running
        jobs instead (only to their script with `batch_only`) and do not end them. With
        `filter` (keys user, states, name, partition, account, qos, nodes), the live jobs
        whose fields all match (only the caller's unless it names a user), among `ids` if
        any are given."""
        extra: dict[str, Any] = {"filter": filter} if filter is not None else {}
        if signal is not None:
            extra.update(signal=signal, batch_only=batch_only)
        return self.request(protocol.CANCEL, ids=ids, **extra)

    def update(self, ids: list[int | str], *, time_limit_s: int | None = None,
               qos: str | None = None, name: str | None = None) -> dict[str, Any]:
        """Change pending jobs' time limit (seconds, 0 for none), QOS or name (a running job's
        name too); the reply has `done` and `errors`. Owners may only lower a limit and move to
        a QOS of no higher priority; admins may do anything within the QOS's max_time."""
        fields: dict[str, Any] = {k: v for k, v in (("time_limit_s", time_limit_s),
                                                    ("qos", qos), ("name", name))
                                  if v is not None}
        return self.request(protocol.UPDATE, ids=ids, **fields)

    def hold(self, ids: list[int | str]) -> dict[str, Any]:
        """Hold pending jobs; the reply has `done` and `errors`, as for the next two."""
        return self.request(protocol.HOLD, ids=ids)

    def release(self, ids: list[int | str]) -> dict[str, Any]:
        return self.request(protocol.RELEASE, ids=ids)

    def requeue(self, ids: list[int | str]) -> dict[str, Any]:
        return self.request(protocol.REQUEUE, ids=ids)

    def history(self, since: float, until: float, user: str | None = None,
                states: list[str] | None = None, ids: list[int] | None = None,
                partition: str | None = None) -> list[dict[str, Any]]:
        """Jobs from the head's store submitted by `until` and not ended before `since`; of
        `ids` only (a job id, or an array's: all its tasks) and `partition` when given."""
        extra: dict[str, Any] = {k: v for k, v in (("ids", ids), ("partition", partition))
                                 if v is not None}
        return self._pages(protocol.HISTORY, since=since, until=until, user=user, states=states,
                           **extra)

    def accounting(self, since: float, until: float) -> list[dict[str, Any]]:
        """GPU-seconds in [since, until]: rows of user, account, qos, state, gpu_seconds."""
        return list(self.request(protocol.ACCOUNTING, since=since, until=until)["rows"])

    def checkpoint(self, job_id: int, restart: int) -> dict[str, Any]:
        """Run `restart` of job `job_id` saved its progress now (`gq checkpoint`)."""
        return self.request(protocol.CHECKPOINT, job_id=job_id, restart=restart)

    def queue(self, user: str | None = None, states: list[str] | None = None,
              all: bool = False, start: bool = False,  # noqa: A002 - mirrors --all
              fields: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """Pending and running jobs (`gq queue --json`'s `jobs`), oldest first, of `user` only
        if given, in `states` only if given; `all` adds jobs that ended in the last 5 minutes;
        `start` gives pending jobs `expected_start` and `expected_nodes` (None where the
        scheduler has no reservation for them); `fields` keeps only those keys of each job."""
        extra: dict[str, Any] = {"start": True} if start else {}
        if fields is not None:
            extra["fields"] = list(fields)
        return self._pages(protocol.QUEUE, user=user, states=states, all=all, **extra)

    def queue_texts(self, user: str | None = None, states: list[str] | None = None,
                    all: bool = False) -> list[bytes]:  # noqa: A002 - mirrors --all
        """queue()'s jobs, each as its text in `gq queue --json`'s document (ASCII, indented
        to its depth there), for render.emit_jobs_json to join: no records decoded, no JSON
        written."""
        return self._pages(protocol.QUEUE, user=user, states=states, all=all, text=True)

    def _pages(self, msg_type: str, **fields: Any) -> list[Any]:
        """Every job of a listing, asked for a page at a time: no reply outgrows the message
        limit, however many jobs there are. (A page is as of its own request.)"""
        jobs: list[Any] = []
        after = 0
        with gcpause.paused():  # records decoded by the thousand: see gq.gcpause
            while True:
                reply = self.request(msg_type, after=after, limit=defaults.PAGE_JOBS, **fields)
                jobs += reply["jobs"]
                if reply.get("next") is None:
                    return jobs
                if not isinstance(reply["next"], int) or reply["next"] <= after:
                    raise ProtocolError(f"{msg_type} reply: page cursor {reply['next']!r} does "
                                        f"not move past {after}")  # else this loop would not end
                after = reply["next"]

    def show(self, job_id: int | str) -> dict[str, Any]:
        """Everything about one job, running or long ended (`123` or `"123_7"`); NotFoundError
        if the head has no such job."""
        return dict(self.request(protocol.SHOW, id=job_id)["job"])

    def nodes(self) -> list[dict[str, Any]]:
        """Nodes and their GPUs with telemetry and the job holding each (`gq nodes --json`)."""
        return list(self.request(protocol.NODES)["nodes"])

    def partitions(self) -> list[dict[str, Any]]:
        """The partitions: name, nodes, default, default_qos, default_time_s, max_time_s."""
        return list(self.request(protocol.NODES).get("partitions") or [])

    def drain(self, nodes: list[str], reason: str) -> list[str]:
        return list(self.request(protocol.DRAIN, nodes=nodes, reason=reason)["nodes"])

    def resume(self, nodes: list[str]) -> list[str]:
        return list(self.request(protocol.RESUME, nodes=nodes)["nodes"])

    def wait(self, ids: list[int], timeout_s: float | None = None) -> list[dict[str, Any]]:
        """Block until every job has ended (or `timeout_s` passes); their final records.

        The head parks the request and answers when the jobs end; re-asking every WAIT_POLL_S
        means a restarted head costs a wait nothing.
        """
        end = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            poll = defaults.WAIT_POLL_S if end is None else max(0.0, min(
                defaults.WAIT_POLL_S, end - time.monotonic()))
            reply = self.request(protocol.WAIT, timeout_s=poll + self.timeout_s, ids=ids,
                                 park_s=poll)
            if reply.get("done") or (end is not None and time.monotonic() >= end):
                return list(reply["jobs"])


    def events(self, since: int | None = None, follow: bool = False, *, oldest: bool = False,
               user: str | None = None, job: int | None = None, array: int | None = None,
               kinds: list[str] | None = None, limit: int = defaults.EVENTS_PAGE
               ) -> Iterator[dict[str, Any]]:
        """Job and node events after sequence number `since` (None: from now on; with
        `oldest`, from the oldest kept), oldest first, as dicts (docs/API.md); only those of
        `user`, job `job`, array `array` or `kinds` ("job", "node") if given. Without
        `follow` it ends with the newest committed event; with it, it waits for more for ever,
        and a head that restarts or is out of reach for a while costs it nothing: it asks again
        from the last event it gave, so each event comes exactly once. A pruned `since` raises
        GoneError saying where the stream now starts."""
        filters = {k: v for k, v in (("user", user), ("job", job), ("array", array),
                                     ("kinds", kinds)) if v is not None}
        cursor = since
        while True:
            park = defaults.WAIT_POLL_S if follow else 0.0
            try:
                reply = self.request(protocol.EVENTS, timeout_s=park + self.timeout_s,
                                     since=cursor, oldest=oldest, limit=limit, park_s=park,
                                     **filters)
            except UnreachableError:
                if not follow:
                    raise
                time.sleep(defaults.EVENTS_RETRY_S)
                continue
            yield from reply["events"]
            cursor = reply["next"]
            if not follow and cursor >= reply["last"]:
                return

    def token_create(self, name: str = "", expires_s: float = defaults.TOKEN_EXPIRES_S,
                     read_only: bool = False, user: str | None = None) -> dict[str, Any]:
        """A new API token of yours (an admin's: of `user`): {"token": "gq_...", "id", "name",
        "user", "uid", "created", "expires", "read_only"}. The token is shown only here."""
        extra: dict[str, Any] = {"user": user} if user is not None else {}
        return self.request(protocol.TOKEN_CREATE, name=name, expires_s=expires_s,
                            read_only=read_only, **extra)

    def token_list(self, everyone: bool = False) -> list[dict[str, Any]]:
        """Your tokens' records (an admin's with `everyone`: all users'), never the tokens."""
        return list(self.request(protocol.TOKEN_LIST, all=everyone)["tokens"])

    def token_revoke(self, ids: list[int]) -> dict[str, Any]:
        """Revoke tokens by id: at once, for every request after; `done` and `errors`."""
        return self.request(protocol.TOKEN_REVOKE, ids=ids)


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)
