"""Hostile traffic on a real server on loopback: the connection cap, clients that leave,
the queue's time bound, and bodies the server answers early.

- idle sockets at the connection cap make room (oldest idle first, as nginx reuses its
  idle connections) instead of delaying everyone until the header timeout frees slots;
- a client gone before its batch is formed is never computed, whenever it left;
- the queue's time bound is estimated from the rate the queue really drains at.
"""

from __future__ import annotations

import socket
import time

import httpx
import pytest
from wattserve.server.settings import Settings

from tests.gated_engine import GatedEngine
from tests.servers import threaded_server

GOOD = b'{"inputs":[{"name":"x","shape":[1,2],"datatype":"FP32","data":[1.0,2.0]}]}'
INFER = "/v2/models/gated/infer"


def serve(engine: GatedEngine, **overrides):
    defaults = dict(model="gated", batcher="dynamic", max_batch_size=4, max_queue_delay_ms=0,
                    max_queue_size=64, warmup=False, telemetry=False)  # fmt: skip
    return threaded_server(Settings(**{**defaults, **overrides}), engine_factory=lambda s: engine)


def host_port(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def closed_by_server(s: socket.socket, within_s: float) -> bool:
    """True if the server closed ``s`` (EOF or reset) within ``within_s`` with no answer."""
    s.settimeout(within_s)
    try:
        return s.recv(4096) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


# ---------------------------------------------------------------- idle sockets at the cap
def test_at_the_cap_the_oldest_idle_connections_make_room():
    """60 silent sockets against a cap of 40 (header timeout 30 s, so nothing frees a slot
    on its own): the 20 newest are served by closing the 20 oldest, and a normal request
    still gets through at once."""
    with serve(GatedEngine(), max_connections=40, header_timeout_s=30) as (url, _app):
        socks = []
        try:
            for _ in range(60):
                socks.append(socket.create_connection(host_port(url), timeout=5))
                time.sleep(0.002)  # keep the order of arrival the order of opening
            t0 = time.monotonic()
            r = httpx.post(
                url + INFER, content=GOOD, headers={"content-type": "application/json"}, timeout=10
            )
            assert r.status_code == 200
            # at once (the issue asks 0.5 s; 2 s leaves room for a machine shared by many
            # jobs): nothing but eviction frees a slot before the 30 s header timeout
            assert time.monotonic() - t0 < 2.0
            oldest = sum(closed_by_server(s, 1.0) for s in socks[:20])
            newest = sum(closed_by_server(s, 0.05) for s in socks[-15:])
            assert oldest == 20  # closed, not answered 503
            assert newest == 0  # still open: they were the newest idle
            metrics = httpx.get(url + "/metrics", timeout=5).text
            assert 'wattserve_connections_refused_total{reason="idle_evicted"}' in metrics
        finally:
            for s in socks:
                s.close()


def test_idle_keep_alive_connection_makes_room_but_a_busy_one_does_not():
    """Between keep-alive requests a connection is idle (closable); one in the middle of a
    request header is not: with every slot busy, a new connection gets 503 + Retry-After."""
    with serve(GatedEngine(), max_connections=20, header_timeout_s=30) as (url, _app):
        host, port = host_port(url)
        kept = socket.create_connection((host, port), timeout=5)
        kept.sendall(b"GET /v2/health/live HTTP/1.1\r\nhost: x\r\n\r\n")
        assert kept.recv(65536).startswith(b"HTTP/1.1 200")  # now idle between requests
        busy = []
        try:
            for _ in range(19):  # fill the cap with connections inside a request header
                s = socket.create_connection((host, port), timeout=5)
                s.sendall(b"POST /v2/models/gated/infer HTTP/1.1\r\nhost: x\r\n")
                busy.append(s)
            time.sleep(0.3)
            newcomer = socket.create_connection((host, port), timeout=5)
            busy.append(newcomer)
            assert closed_by_server(kept, 2.0)  # the idle keep-alive one made room
            newcomer.sendall(b"POST /v2/models/gated/infer HTTP/1.1\r\nhost: x\r\n")
            time.sleep(0.1)
            refused = socket.create_connection((host, port), timeout=5)  # nothing idle is left
            busy.append(refused)
            refused.settimeout(2)
            answer = refused.recv(4096)
            assert answer.startswith(b"HTTP/1.1 503") and b"retry-after" in answer.lower()
            assert not closed_by_server(busy[0], 0.05)  # busy ones are never closed for room
        finally:
            kept.close()
            for s in busy:
                s.close()


# ---------------------------------------------------------------- gone clients
def test_client_gone_before_its_batch_is_formed_is_never_computed(monkeypatch):
    """The engine is held busy; a client sends a whole request and hangs up. Once the
    server has seen the hang-up (its queue empties), the engine is released: the gone
    client's request must not be computed. (The old watcher started 20 ms after
    submission; a longer window here makes the race deterministic.)"""
    from wattserve.server.http.routes import common

    monkeypatch.setattr(common, "WATCH_AFTER_S", 30.0)
    engine = GatedEngine(max_batch_size=1)
    with serve(engine, max_batch_size=1) as (url, app):
        host, port = host_port(url)
        runtime = app.state.runtime
        engine.gate.clear()
        holder = socket.create_connection((host, port), timeout=10)  # occupies the engine
        holder.sendall(_post(b'{"inputs":[{"name":"x","shape":[1,2],"datatype":"FP32","data":[1.0,1.0]}]}'))
        assert engine.started.wait(5)
        gone = socket.create_connection((host, port), timeout=10)
        gone.sendall(_post(b'{"inputs":[{"name":"x","shape":[1,2],"datatype":"FP32","data":[7.0,7.0]}]}'))
        _wait(lambda: runtime.batcher.queue_depth == 1, "the gone client's request queued")
        gone.close()
        _wait(lambda: runtime.batcher.queue_depth == 0, "the hang-up seen while queued")
        engine.gate.set()
        assert holder.recv(65536).startswith(b"HTTP/1.1 200")
        holder.close()
        r = httpx.post(url + INFER, content=GOOD, headers={"content-type": "application/json"}, timeout=10)
        assert r.status_code == 200  # a later batch has run
        assert 7.0 not in engine.seen
        assert engine.seen == [1.0, 1.0]


def _post(body: bytes) -> bytes:
    return (b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
            % (INFER.encode(), len(body)) + body)  # fmt: skip


def _wait(predicate, what: str, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            pytest.fail(f"not reached in {timeout} s: {what}")
        time.sleep(0.005)


# ---------------------------------------------------------------- the queue's time bound
async def test_time_bound_follows_the_drain_when_the_event_loop_sets_the_pace():
    """The engine computes a batch of 2 in 5 ms (400 rows/s), but every batch is formed on
    an event loop that is busy 45 ms at a time (parsing bodies, say): the queue drains at
    about 40 rows/s. 40 queued rows are then about a second of waiting, over a 0.5 s bound:
    refused. (Estimated from the engine's compute rate they were 0.1 s: admitted, and then
    waited ten times the bound.)"""
    import asyncio

    from wattserve.batchers import BatcherConfig, ContinuousBatcher, QueueFull, WorkItem

    from tests.gated_engine import item_input

    engine = GatedEngine(max_batch_size=2, delay_s=0.005)
    b = ContinuousBatcher(
        [engine], BatcherConfig(max_batch_size=2, max_queue_size=1000, max_queue_wait_s=0.5)
    )
    b.pipeline = False  # every batch is formed on the event loop
    b.queue_wait_bound_s = 0.0  # the estimate at admission only (the bound kept later: next test)
    runner = asyncio.create_task(b.run())
    busy = True

    async def hog() -> None:
        while busy:
            time.sleep(0.045)  # noqa: ASYNC251 - the loop is busy on purpose; nothing else runs
            await asyncio.sleep(0)

    hogger = asyncio.create_task(hog())
    waiters = [asyncio.create_task(b.submit(WorkItem(item_input(float(i))))) for i in range(60)]
    try:
        while len(engine.batches) < 8:  # noqa: ASYNC110 - the engine thread appends, no event to await
            await asyncio.sleep(0.01)
        queued = b.queue.rows
        assert queued >= 30
        assert b.service_rate.wait_s(queued, b.clock.now()) > 0.5
        with pytest.raises(QueueFull, match="s of work"):
            b.check_admission()
    finally:
        busy = False
        await hogger
        await asyncio.gather(*waiters)
        await b.drain()
        await runner
        b.close()


async def test_a_request_that_waited_the_bound_is_answered_503_and_never_computed():
    """Admission let three requests in (nothing measured the drain yet); then the engine
    stalled on the first past the 0.3 s bound. The two still queued must not be computed
    after waiting longer than the bound: they are answered QueueWaitExceeded (503 +
    Retry-After) when the next batch forms, and the queue goes on serving. (Before, they
    were computed whatever they had waited: mobilenet_v2 requests waited 2.25x the bound.)
    On a fake clock: the stall is time the test moves, not a sleep."""
    import asyncio

    from wattserve.batchers import DynamicBatcher, DynamicConfig, QueueWaitExceeded, WorkItem

    from tests.fake_clock import FakeClock, until
    from tests.gated_engine import item_input

    clock = FakeClock()
    engine = GatedEngine(max_batch_size=1)
    config = DynamicConfig(max_batch_size=1, max_queue_size=100, max_queue_wait_s=0.3)
    b = DynamicBatcher([engine], config, clock=clock)
    runner = asyncio.create_task(b.run())

    def request(value: float) -> WorkItem:
        return WorkItem(item_input(value), arrival=clock.now())

    try:
        engine.gate.clear()
        first = asyncio.create_task(b.submit(request(1.0)))
        assert await asyncio.to_thread(engine.started.wait, 10)
        late = [asyncio.create_task(b.submit(request(v))) for v in (2.0, 3.0)]
        await until(lambda: len(b.queue) == 2)
        await clock.advance(0.3)
        assert not any(waiter.done() for waiter in late)  # the bound itself is not over it
        await clock.advance(0.1)  # past the bound while the engine is stalled
        engine.gate.set()
        assert (await first).outputs["y"][0, 0] == 2.0
        for waiter in late:
            with pytest.raises(QueueWaitExceeded, match=r"over the bound of 0\.3 s"):
                await waiter
        assert QueueWaitExceeded.retry_after and QueueWaitExceeded.status.name == "UNAVAILABLE"
        assert QueueWaitExceeded.outcome == "queue_timeout"  # counted apart from admission's refusals
        fresh = await b.submit(request(4.0))  # the queue goes on
        assert fresh.outputs["y"][0, 0] == 8.0
        assert engine.seen == [1.0, 4.0]  # the two overdue ones were never computed
        assert fresh.queue_time_s == 0.0
    finally:
        engine.gate.set()
        await b.drain()
        await runner
        b.close()


# ---------------------------------------------------------------- no silent closes
def test_refused_body_sent_slowly_still_gets_its_answer():
    """A request refused before its body is read (413 here) is answered with ``Connection:
    close`` and the server keeps reading (and dropping) the body, as nginx's lingering
    close does, for as long as the client keeps sending: a client that takes 3 s to send
    its body (a busy machine, a slow link) reads its answer. Closing after a fixed 2 s
    with bytes unread reset the connection, and the reset destroyed the answer."""
    with serve(GatedEngine(), max_body_bytes=2**20) as (url, _app):
        size = 2 * 2**20
        s = socket.create_connection(host_port(url), timeout=10)
        try:
            s.sendall(b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
                      % (INFER.encode(), size))  # fmt: skip
            piece = b"7" * (size // 10)
            for _ in range(10):  # like a client that sends its whole body before reading
                s.sendall(piece)
                time.sleep(0.3)
            answer = b""
            while chunk := s.recv(65536):
                answer += chunk
        finally:
            s.close()
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        assert b"connection: close" in answer.lower()


def test_unread_body_after_an_early_answer_is_not_counted_as_a_header():
    """An early answer (415, keep-alive) leaves a 2 MB body to arrive afterwards: those are
    body bytes of the answered request, not the next request's header, so the connection
    stays usable (they were counted as header bytes: a 431 and a close the client, told
    keep-alive, could not expect)."""
    with serve(GatedEngine(), max_body_bytes=64 * 2**20) as (url, _app):
        body = b"7" * (2 * 2**20)
        s = socket.create_connection(host_port(url), timeout=10)
        try:
            s.sendall(b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-type: text/plain\r\ncontent-length: %d\r\n\r\n"
                      % (INFER.encode(), len(body)))  # fmt: skip
            first = _read_response(s)  # answered from the header alone
            s.sendall(body)
            assert first.startswith(b"HTTP/1.1 415"), first[:200]
            if b"connection: close" in first.lower():
                return  # announced: the client opens a new connection, nothing is lost
            s.sendall(_post(GOOD))
            second = _read_response(s)
            assert second.startswith(b"HTTP/1.1 200"), second[:200]
        finally:
            s.close()


def _read_response(s: socket.socket) -> bytes:
    """One response with a Content-Length body ('' if the server closed first)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.lower().split(b"\r\n")
        if line.startswith(b"content-length:")
    )
    while len(rest) < length:
        chunk = s.recv(65536)
        if not chunk:
            break
        rest += chunk
    return head + b"\r\n\r\n" + rest
