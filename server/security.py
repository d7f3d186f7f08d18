"""Who may call what: Triton's restricted-API groups and an optional bearer token for
inference. Installed only when configured, so an open local server pays nothing.

Triton's syntax (``--http-restricted-api``): ``API[,API...]:HEADER=VALUE``. A request to an
API in a restricted group must carry that header with that value (403 otherwise). The
bearer token (``WATTSERVE_API_TOKEN``) guards inference (401 with ``WWW-Authenticate``).
"""

from __future__ import annotations

import hmac
import re
from dataclasses import dataclass
from typing import Any

import orjson

APIS = ("health", "metadata", "inference", "model-config", "model-repository", "statistics",
        "shared-memory", "trace", "logging")  # fmt: skip

# Order matters: the first pattern that matches names the API group of a path.
_ROUTES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^/v2/health(/|$)"), "health"),
    (re.compile(r"^/v2/repository(/|$)"), "model-repository"),
    (re.compile(r"^/v2/models/[^/]+(/versions/[^/]+)?/(infer|classify|generate(_stream)?)$"), "inference"),
    (re.compile(r"^/v2/models/[^/]+(/versions/[^/]+)?/config$"), "model-config"),
    (re.compile(r"^/v2/models/[^/]+(/versions/[^/]+)?/stats$"), "statistics"),
    (re.compile(r"^/v2/models/stats$"), "statistics"),
    (re.compile(r"^/v2/(system|cuda)sharedmemory(/|$)"), "shared-memory"),
    (re.compile(r"^/v2(/models/[^/]+)?/trace/setting$"), "trace"),
    (re.compile(r"^/v2/logging$"), "logging"),
    (re.compile(r"^/v2(/models/[^/]+(/versions/[^/]+)?(/ready)?)?/?$"), "metadata"),
)


def api_of(path: str) -> str | None:
    """The Triton API group a path belongs to (None: not a v2 API, e.g. /metrics)."""
    for pattern, api in _ROUTES:
        if pattern.match(path):
            return api
    return None


@dataclass(frozen=True)
class Restriction:
    apis: frozenset[str]
    header: bytes  # lower-case header name
    value: bytes


def parse_restricted_api(text: str | None) -> list[Restriction]:
    """``"model-repository,statistics:admin-key=s3cret;inference:x-team=a"`` -> restrictions."""
    out: list[Restriction] = []
    for group in filter(None, (g.strip() for g in (text or "").split(";"))):
        apis_part, sep, header_part = group.partition(":")
        name, eq, value = header_part.partition("=")
        if not sep or not eq or not name.strip():
            raise ValueError(f"restricted_api group {group!r} is not 'API[,API...]:HEADER=VALUE'")
        apis = frozenset(a.strip() for a in apis_part.split(",") if a.strip())
        unknown = sorted(apis - set(APIS))
        if unknown or not apis:
            raise ValueError(f"restricted_api: unknown API(s) {unknown or apis_part!r}; known: {APIS}")
        out.append(Restriction(apis, name.strip().lower().encode(), value.strip().encode()))
    seen: set[str] = set()
    for r in out:
        if seen & r.apis:
            raise ValueError(f"restricted_api: API(s) {sorted(seen & r.apis)} restricted twice")
        seen |= r.apis
    return out


class AccessControl:
    """Pure-ASGI guard in front of the app."""

    def __init__(self, app: Any, restrictions: list[Restriction], api_token: str | None) -> None:
        self.app = app
        self.restrictions = restrictions
        self.token = api_token.encode() if api_token else None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            refusal = self._refusal(scope)
            if refusal is not None:
                await _send_error(send, *refusal)
                return
        await self.app(scope, receive, send)

    def _refusal(self, scope: dict[str, Any]) -> tuple[int, str, list[tuple[bytes, bytes]]] | None:
        api = api_of(scope["path"])
        if api is None:
            return None
        headers = dict(scope["headers"])
        for r in self.restrictions:
            if api in r.apis:
                got = headers.get(r.header)
                if got is None or not hmac.compare_digest(got, r.value):
                    return 403, f"This API is restricted, expecting header '{r.header.decode()}'", []
        if self.token is not None and api == "inference":
            auth = headers.get(b"authorization", b"")
            scheme, _, token = auth.partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(token.strip(), self.token):
                return 401, "missing or wrong bearer token", [(b"www-authenticate", b"Bearer")]
        return None


async def _send_error(send: Any, status: int, message: str, extra: list[tuple[bytes, bytes]]) -> None:
    body = orjson.dumps({"error": message})
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)), *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
