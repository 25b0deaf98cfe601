"""gq api's long answers: a job's output (followed until the job ends) and the event stream as
Server-Sent Events.

Output: gq api reads the job's output file itself, at the path gqd recorded (`stdout`), on its
own host: it serves output where it shares the nodes' filesystem (the head host with a shared
/home, say), and says so plainly where it cannot read the file. Its owner was checked by gqd
(the job's record is shown only to its owner's token).

Events: one parked `events` request after another, each from the last event sent, so a gqd
restart or a dropped connection to gqd costs a consumer nothing: the stream goes on from the
same sequence number once gqd answers again, and a consumer that reconnects with Last-Event-ID
gets every event after it exactly once.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.responses import Response, StreamingResponse

from gq import defaults
from gq.api.guard import error_body
from gq.errors import GqError, NotFoundError, UnreachableError

log = logging.getLogger("gq.api")

#: Bytes read from an output file at a time.
CHUNK = 64 * 1024
#: While following output, how often the job's state is asked for, in seconds.
STATE_POLL_S = 1.0
_LIVE = ("PENDING", "RUNNING")


def _read(path: str, offset: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(CHUNK)


async def output(job: dict[str, Any], which: str, offset: int, follow: bool,
                 show: Callable[[], Awaitable[dict[str, Any]]]) -> Response:
    """The job's output from `offset`; with `follow`, streamed on until the job has ended."""
    path = job[which]
    try:
        first = await asyncio.to_thread(_read, path, offset)
    except FileNotFoundError:
        if not follow or job["state"] not in _LIVE:
            raise NotFoundError(f"job {job['job_id']}'s output file {path} does not exist (yet) "
                                "where gq api runs (it reads output from the filesystem it "
                                "shares with the nodes)") from None
        first = b""
    except OSError as exc:
        raise NotFoundError(f"job {job['job_id']}'s output file {path} cannot be read where gq "
                            f"api runs: {exc.strerror}") from None
    if not follow:
        return StreamingResponse(_rest(path, offset, first), media_type="text/plain")
    return StreamingResponse(_follow(job, path, offset, first, show), media_type="text/plain")


async def _rest(path: str, offset: int, first: bytes) -> AsyncIterator[bytes]:
    chunk = first
    while chunk:
        yield chunk
        offset += len(chunk)
        chunk = await asyncio.to_thread(_read, path, offset)


async def _follow(job: dict[str, Any], path: str, offset: int, first: bytes,
                  show: Callable[[], Awaitable[dict[str, Any]]]) -> AsyncIterator[bytes]:
    chunk, state, asked = first, job["state"], asyncio.get_running_loop().time()
    while True:
        while chunk:
            yield chunk
            offset += len(chunk)
            chunk = await _try_read(path, offset)
        if state not in _LIVE:
            return  # ended, and everything it wrote was read after that
        await asyncio.sleep(defaults.API_OUTPUT_POLL_S)
        now = asyncio.get_running_loop().time()
        if now - asked >= STATE_POLL_S:
            asked = now
            try:
                state = (await show())["state"]
            except UnreachableError:
                pass  # gqd restarting: keep following
        chunk = await _try_read(path, offset)


async def _try_read(path: str, offset: int) -> bytes:
    try:
        return await asyncio.to_thread(_read, path, offset)
    except OSError:
        return b""  # not there yet (a pending job), or gone: nothing more to send now


def sse(event: dict[str, Any]) -> bytes:
    return f"id: {event['seq']}\nevent: {event['kind']}\ndata: {json.dumps(event)}\n\n".encode()


def events(first: dict[str, Any],
           more: Callable[[int, float], Awaitable[dict[str, Any]]]) -> Response:
    """The stream: `first`'s events, then those each `more(since, park_s)` brings."""
    return StreamingResponse(_events(first, more), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _events(first: dict[str, Any],
                  more: Callable[[int, float], Awaitable[dict[str, Any]]]) -> AsyncIterator[bytes]:
    # EventSource reconnects after `retry` ms, with Last-Event-ID: the last id it got.
    yield b"retry: 1000\n\n"
    reply = first
    while True:
        if reply["events"]:
            yield b"".join(sse(e) for e in reply["events"])
        else:
            yield b": keep-alive\n\n"  # also how a dropped client is noticed
        cursor = reply["next"]
        while True:
            try:
                reply = await more(cursor, defaults.API_EVENTS_PARK_S)
                break
            except UnreachableError:
                yield b": gqd unreachable, retrying\n\n"
                await asyncio.sleep(defaults.EVENTS_RETRY_S)
            except GqError as exc:  # a revoked token, pruned events: said, and the stream ends
                yield f"event: error\ndata: {json.dumps(error_body(exc))}\n\n".encode()
                return
