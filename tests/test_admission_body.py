"""The inference route's header pass and body reservation (server/http/routes/body.py, the budget
in server/core/decode.py): one pass over
the raw headers reads what Starlette's header lookups would, and a body's reservation is
given back by whoever holds it, or at once when reading fails."""

from __future__ import annotations

import pytest
from starlette.datastructures import Headers
from starlette.requests import Request
from wattserve.batchers.status import Status
from wattserve.batchers.types import ClientGone
from wattserve.server.core.decode import BodyBudget, BudgetExceeded
from wattserve.server.core.request import BadRequest
from wattserve.server.http.routes.body import inference_headers, read_reserved_body

RAW_HEADER_LISTS = [
    [],
    [(b"content-type", b"application/json"), (b"content-length", b"12")],
    [
        (b"content-length", b"5"),
        (b"content-length", b"7"),
        (b"content-type", b"a/b"),
        (b"content-type", b"c/d"),
    ],
    [
        (b"inference-header-content-length", b"40"),
        (b"host", b"x"),
        (b"content-type", b"application/octet-stream"),
    ],
    [(b"content-type", b""), (b"content-type", b"text/plain")],
    [(b"content-type", b"application/json; charset=\xe9")],  # latin-1, as Starlette decodes
]


@pytest.mark.parametrize("raw", RAW_HEADER_LISTS)
def test_one_pass_reads_what_starlette_headers_read(raw):
    starlette = Headers(raw=raw)
    expected = (
        starlette.get("content-type", ""),
        starlette.get("content-length"),
        starlette.get("inference-header-content-length"),
    )
    assert inference_headers({"headers": raw}) == expected


def request_with(chunks: list[bytes], length: int | None, disconnect_after: int | None = None) -> Request:
    messages = [
        {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)
    ]
    if disconnect_after is not None:
        messages = [*messages[:disconnect_after], {"type": "http.disconnect"}]

    async def receive():
        return messages.pop(0)

    headers = [(b"content-length", str(length).encode())] if length is not None else []
    return Request({"type": "http", "method": "POST", "headers": headers}, receive)


async def test_a_read_body_stays_reserved_until_its_holder_gives_it_back():
    budget = BodyBudget(100)
    body, held = await read_reserved_body(request_with([b"x" * 30], 30), "30", 1000, budget)
    assert (body, held, budget.used) == (b"x" * 30, 30, 30)
    budget.release(held)
    body, held = await read_reserved_body(request_with([b"ab", b"cd"], None), None, 1000, budget)  # chunked
    assert (body, held, budget.used) == (b"abcd", 4, 4)
    budget.release(held)
    assert budget.used == 0


async def test_every_failed_read_gives_its_reservation_back():
    budget = BodyBudget(10)
    with pytest.raises(BadRequest) as too_big:
        await read_reserved_body(request_with([b"x" * 50], 50), "50", 20, budget)
    assert too_big.value.status is Status.TOO_LARGE  # HTTP 413
    with pytest.raises(BudgetExceeded):
        await read_reserved_body(request_with([b"x" * 15], 15), "15", 1000, budget)
    with pytest.raises(BudgetExceeded):  # chunked: over the budget on the third chunk
        await read_reserved_body(request_with([b"1234", b"5678", b"9abc"], None), None, 1000, budget)
    with pytest.raises(ClientGone):  # the client left after the first chunk
        await read_reserved_body(request_with([b"12", b"34"], None, disconnect_after=1), None, 1000, budget)
    with pytest.raises(ClientGone):
        await read_reserved_body(request_with([b"12", b"34"], 4, disconnect_after=1), "4", 1000, budget)
    assert budget.used == 0
