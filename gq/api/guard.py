"""What stands between an HTTP request and gqd: its bearer token, the token's rate limit, the
bound on requests waiting for gqd, and errors as JSON with the CLI's codes and wording."""

from __future__ import annotations

import hashlib
import math
import time
from collections import OrderedDict
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from gq.api.openapi import STATUS
from gq.errors import GqError, RateLimited, Unauthenticated, UnreachableError

#: Token buckets kept (least recently used dropped past it): a flood of made-up tokens cannot
#: grow gq api's memory.
MAX_BUCKETS = 100_000


def token_of(request: Request) -> str:
    """The request's bearer token, or Unauthenticated."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthenticated("unauthenticated: no token; send Authorization: Bearer TOKEN "
                              "(make one with gq token create)")
    return token.strip()


class RateLimit:
    """A token bucket per API token (by its hash): `rate` requests per second on average,
    `burst` at once; rate 0 is no limit."""

    def __init__(self, rate: float, burst: int):
        self.rate, self.burst = rate, max(1, burst)
        self.buckets: OrderedDict[bytes, tuple[float, float]] = OrderedDict()

    def take(self, token: str, now: float | None = None) -> None:
        """Use one request of the token's, or RateLimited saying when to try again."""
        if self.rate <= 0:
            return
        now = time.monotonic() if now is None else now
        key = hashlib.sha256(token.encode()).digest()[:16]
        level, at = self.buckets.pop(key, (float(self.burst), now))
        level = min(float(self.burst), level + (now - at) * self.rate)
        if level < 1.0:
            self.buckets[key] = (level, now)
            wait = (1.0 - level) / self.rate
            raise RateLimited(f"rate limited: this token may make {self.rate:g} requests a "
                              f"second ([api] rate_per_s); try again in {wait:.2f}s",
                              ) from _Retry(wait)
        self.buckets[key] = (level - 1.0, now)
        if len(self.buckets) > MAX_BUCKETS:
            self.buckets.popitem(last=False)


class _Retry(Exception):
    """Carries a 429's Retry-After (seconds) as the cause of its RateLimited."""

    def __init__(self, seconds: float):
        super().__init__(seconds)
        self.seconds = seconds


class InFlight:
    """A bound on gq requests waiting for gqd from this process, all tokens together."""

    def __init__(self, limit: int):
        self.limit, self.now = limit, 0

    def __enter__(self) -> InFlight:
        if self.limit and self.now >= self.limit:
            raise UnreachableError(f"gq api has {self.limit} requests waiting for gqd "
                                   "([api] max_in_flight); try again")
        self.now += 1
        return self

    def __exit__(self, *exc: object) -> None:
        self.now -= 1


def error_body(exc: GqError) -> dict[str, Any]:
    return {"error": {"code": exc.code, "message": str(exc)}}


def error_response(exc: GqError) -> JSONResponse:
    """A GqError as the API answers it: its status, its code and the CLI's message."""
    status = STATUS.get(exc.code, 500)
    headers = {}
    if status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="gq"'
    cause = exc.__cause__
    if isinstance(cause, _Retry):
        headers["Retry-After"] = str(max(1, math.ceil(cause.seconds)))
    elif status == 503:
        headers["Retry-After"] = "1"
    return JSONResponse(error_body(exc), status_code=status, headers=headers)
