"""A response's head leaves with its body in one write (server/http_protocol.py,
``_LingeringClose``), over a real loopback connection; writes are counted on the way through.
A head whose body does not follow at once (a streamed response) still goes out on the loop's
next turn, and a close never loses a held head."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from wattserve.server.http_protocol import _LingeringClose

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


async def connection():
    """(counted server transport, client reader, the listening server); the client's writer
    rides on the reader (a collected writer closes the connection)."""
    loop = asyncio.get_running_loop()
    accepted: asyncio.Future[asyncio.Transport] = loop.create_future()

    class Accept(asyncio.Protocol):
        def connection_made(self, transport) -> None:
            accepted.set_result(transport)

    server = await loop.create_server(Accept, "127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
    reader.writer = writer  # type: ignore[attr-defined]
    return CountedTransport(await accepted), reader, server


def wrapper(counted: CountedTransport) -> tuple[_LingeringClose, SimpleNamespace]:
    cycle = SimpleNamespace(response_started=False, more_body=False)
    protocol = SimpleNamespace(loop=asyncio.get_running_loop(), cycle=cycle, linger=lambda: None)
    return _LingeringClose(counted, protocol, cycle), cycle  # type: ignore[arg-type]


async def test_head_and_body_leave_in_one_write():
    counted, reader, server = await connection()
    transport, cycle = wrapper(counted)
    cycle.response_started = True  # uvicorn sets it before writing the head
    transport.write(HEAD)
    transport.write(b"hello")
    assert counted.calls == ["writelines"]
    assert await reader.readexactly(len(HEAD) + 5) == HEAD + b"hello"
    await asyncio.sleep(0.01)  # the next-turn flush finds nothing left to send
    assert counted.calls == ["writelines"]
    transport.close()
    server.close()


async def test_continue_goes_out_at_once_and_the_head_is_still_held():
    counted, reader, server = await connection()
    transport, cycle = wrapper(counted)
    transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # before any response: not held
    assert counted.calls == ["write"]
    assert await reader.readexactly(25) == b"HTTP/1.1 100 Continue\r\n\r\n"
    cycle.response_started = True
    transport.write(HEAD)
    transport.write(b"hello")
    assert counted.calls == ["write", "writelines"]
    transport.close()
    server.close()


async def test_a_head_without_body_yet_goes_out_on_the_next_turn():
    counted, reader, server = await connection()
    transport, cycle = wrapper(counted)
    cycle.response_started = True
    transport.write(HEAD)  # a streamed response: its first chunk comes later
    assert counted.calls == []
    assert await asyncio.wait_for(reader.readexactly(len(HEAD)), 5) == HEAD
    transport.write(b"hello")
    assert counted.calls == ["write", "write"]
    assert await reader.readexactly(5) == b"hello"
    transport.close()
    server.close()


async def test_close_sends_a_held_head_first():
    counted, reader, server = await connection()
    transport, cycle = wrapper(counted)
    cycle.response_started = True
    transport.write(HEAD)
    transport.close()
    assert await asyncio.wait_for(reader.read(), 5) == HEAD  # the head, then end of stream
    server.close()
