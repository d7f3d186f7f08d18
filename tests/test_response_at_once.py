"""An inference answer is written to the connection in one go (``server.http.protocol.
write_response_at_once``), standing in for uvicorn's two ASGI sends: the same head (the
server's date and keep-alive hint, the route's own headers, an exact content-length), the
connection kept alive or closed as uvicorn would, pipelined requests answered in order."""

from __future__ import annotations

import socket

import orjson
from wattserve.server.http.protocol import write_response_at_once
from wattserve.server.settings import Settings

from tests.servers import threaded_server

BODY = orjson.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32",
                                 "data": [float(i) for i in range(16)]}]})  # fmt: skip


def _request(extra: bytes = b"") -> bytes:
    return (b"POST /v2/models/identity/infer HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n%s\r\n" % (len(BODY), extra)) + BODY  # fmt: skip


def _read_response(sock: socket.socket, buffer: bytearray) -> tuple[bytes, list[tuple[bytes, bytes]], bytes]:
    """One response off the socket: its status line, headers and body (by content-length)."""
    while b"\r\n\r\n" not in buffer:
        chunk = sock.recv(65536)
        assert chunk, "connection closed before a whole head"
        buffer += chunk
    head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
    status, *lines = head.split(b"\r\n")
    headers = [tuple(line.split(b": ", 1)) for line in lines]
    length = int(dict(headers)[b"content-length"])
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed before the whole body"
        rest += chunk
    buffer[:] = rest[length:]
    return status, headers, rest[:length]


def _values(body: bytes) -> list[float]:
    return orjson.loads(body)["outputs"][0]["data"]


def test_answers_on_one_connection_have_uvicorns_head_and_stay_alive():
    settings = Settings(model="identity", max_queue_delay_ms=0, grpc_port=0)
    with threaded_server(settings) as (url, _):
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            buffer = bytearray()
            sock.sendall(_request() + _request())  # pipelined: both answered, in order
            for _ in range(2):
                status, headers, body = _read_response(sock, buffer)
                names = [name for name, _ in headers]
                assert status == b"HTTP/1.1 200 OK"
                assert names.count(b"date") == 1 and names.count(b"content-length") == 1
                assert (b"content-type", b"application/json") in headers
                assert dict(headers)[b"keep-alive"].startswith(b"timeout=")
                assert {b"x-queue-time-ms", b"x-compute-time-ms", b"x-batch-size"} <= set(names)
                assert b"connection" not in names and b"transfer-encoding" not in names
                assert _values(body) == [float(i) for i in range(16)]
            sock.sendall(_request(b"connection: close\r\n"))  # the client's close is honoured
            status, headers, body = _read_response(sock, buffer)
            assert status == b"HTTP/1.1 200 OK" and (b"connection", b"close") in headers
            assert _values(body) == [float(i) for i in range(16)]
            assert sock.recv(1) == b""  # and the server closed the connection


def test_anything_but_uvicorns_cycle_is_left_to_the_response_itself():
    async def send(message):  # an ASGI send of another server (or a test's)
        raise AssertionError("not to be called")

    assert write_response_at_once(send, 200, [(b"content-length", b"0")], b"") is False
