"""What every HTTP router needs: JSON and refusal answers, the gone-client watch, timing headers."""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive
from wattserve.batchers.types import Result, WorkItem
from wattserve.server.core.admission import TIMING_NAMES, Refused, timing_values
from wattserve.server.http.protocol import CONNECTION_KEY
from wattserve.server.http.status import HTTP_STATUS
from wattserve.server.models.runtime import ModelRuntime

WATCH_AFTER_S = 0.02  # answers slower than this get a task watching for a gone client


def json_response(doc: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(doc), status_code=status, media_type="application/json",
                    headers=headers)  # fmt: skip


def error_response(message: str, status: int, retry_after: int | None = None) -> Response:
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return json_response({"error": message}, status, headers)


DRAIN_UNREAD_BODY_BYTES = 64 * 1024  # a refused request's unread body up to this is read, not cut off


def refusal_response(refused: Refused, retry_after_s: int, request: Request | None = None) -> Response:
    """The error answer; a refusal that left a large (or chunked) body unread closes the
    connection instead of draining a body nobody will use."""
    status = HTTP_STATUS[refused.status]
    answer = error_response(str(refused), status, retry_after_s if refused.retry_after else None)
    if refused.body_unread and request is not None:
        declared = request.headers.get("content-length", "")
        if status == 413 or not declared.isdigit() or int(declared) > DRAIN_UNREAD_BODY_BYTES:
            answer.headers["connection"] = "close"
    return answer


async def watching_submit(runtime: ModelRuntime, item: WorkItem, request: Request) -> Result:
    """The admission path's submit (``server.core.admission.Submit``) for an HTTP request:
    cancels the request's item (never computed if still queued) when the client goes away
    first.

    On wattserve's own HTTP protocol (``server.http.protocol``) the connection itself calls
    back when it is lost, from the moment the item is queued: a client gone before its batch
    is formed is never computed. Elsewhere (h11) a watcher task starts after
    ``WATCH_AFTER_S`` (a task per request costs more than the identity model's whole
    budget), so a client that leaves in those first milliseconds may still be computed.
    """
    connection = request.scope.get(CONNECTION_KEY)
    if connection is not None:
        connection.on_lost = partial(runtime.cancel, item)
        try:
            return await runtime.infer(item)
        finally:
            connection.on_lost = None
    loop = asyncio.get_running_loop()
    watcher: list[asyncio.Task[None]] = []

    def start_watching() -> None:
        watcher.append(loop.create_task(_cancel_on_disconnect(request.receive, runtime, item)))

    timer = loop.call_later(WATCH_AFTER_S, start_watching)
    try:
        return await runtime.infer(item)
    finally:
        timer.cancel()
        for task in watcher:
            task.cancel()


async def _cancel_on_disconnect(receive: Receive, runtime: ModelRuntime, item: WorkItem) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            runtime.cancel(item)
            return


def timing_headers(result: Result) -> dict[str, str]:
    """The timing an answer carries (``server.core.admission.TIMING_NAMES``) as headers."""
    return dict(zip(TIMING_NAMES, timing_values(result), strict=True))
