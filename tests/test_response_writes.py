"""A response's head leaves with its body in one write (server/http/protocol.py,
``_LingeringClose``), over a real loopback connection; writes are counted on the way through.
A head whose body does not follow at once (a streamed response) still goes out on the loop's
next turn, and a close never loses a held head."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from wattserve.server.http.protocol import _LingeringClose

HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n"


class CountedTransport:
    """The real server-side transport, counting the calls that reach the socket."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.calls: list[str] = []

    def write(self, data: bytes) -> None:
        self.calls.append("write")
        self.transport.write(data)

    def writelines(self, chunks) -> None:
        self.calls.append("writelines")
        self.transport.writelines(chunks)

    def __getattr__(self, name: str):
        return getattr(self.transport, name)


async def connection(response_started: bool = False) -> SimpleNamespace:
    """A real loopback connection: the wrapped server side (``transport``, its request
    ``cycle``, the ``counted`` writes), the client's ``reader`` and the listening ``server``.
    The client's writer rides along (a collected writer closes the connection)."""
    loop = asyncio.get_running_loop()
    accepted: asyncio.Future[asyncio.Transport] = loop.create_future()

    class Accept(asyncio.Protocol):
        def connection_made(self, transport) -> None:
            accepted.set_result(transport)

    server = await loop.create_server(Accept, "127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
    counted = CountedTransport(await accepted)
    cycle = SimpleNamespace(response_started=response_started, more_body=False)  # uvicorn's cycle
    protocol = SimpleNamespace(loop=loop, cycle=cycle, linger=lambda: None)
    transport = _LingeringClose(counted, protocol, cycle)  # type: ignore[arg-type]
    return SimpleNamespace(transport=transport, cycle=cycle, counted=counted, reader=reader, writer=writer,
                           server=server)  # fmt: skip


async def test_head_and_body_leave_in_one_write():
    c = await connection(response_started=True)  # uvicorn sets it before writing the head
    c.transport.write(HEAD)
    c.transport.write(b"hello")
    assert c.counted.calls == ["writelines"]
    assert await c.reader.readexactly(len(HEAD) + 5) == HEAD + b"hello"
    await asyncio.sleep(0.01)  # the next-turn flush finds nothing left to send
    assert c.counted.calls == ["writelines"]
    c.transport.close()
    c.server.close()


async def test_continue_goes_out_at_once_and_the_head_is_still_held():
    c = await connection()
    c.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # before any response: not held
    assert c.counted.calls == ["write"]
    assert await c.reader.readexactly(25) == b"HTTP/1.1 100 Continue\r\n\r\n"
    c.cycle.response_started = True
    c.transport.write(HEAD)
    c.transport.write(b"hello")
    assert c.counted.calls == ["write", "writelines"]
    c.transport.close()
    c.server.close()


async def test_a_head_without_body_yet_goes_out_on_the_next_turn():
    c = await connection(response_started=True)
    c.transport.write(HEAD)  # a streamed response: its first chunk comes later
    assert c.counted.calls == []
    assert await asyncio.wait_for(c.reader.readexactly(len(HEAD)), 5) == HEAD
    c.transport.write(b"hello")
    assert c.counted.calls == ["write", "write"]
    assert await c.reader.readexactly(5) == b"hello"
    c.transport.close()
    c.server.close()


async def test_close_sends_a_held_head_first():
    c = await connection(response_started=True)
    c.transport.write(HEAD)
    c.transport.close()
    assert await asyncio.wait_for(c.reader.read(), 5) == HEAD  # the head, then end of stream
    c.server.close()
