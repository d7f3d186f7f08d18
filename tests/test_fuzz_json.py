"""Fuzzed KServe v2 infer bodies against a real server on loopback: every one gets a 200
or a 4xx JSON ``{"error": ...}``, never a 5xx (a 503 only for a body that set its own,
microseconds-short, deadline), and the keep-alive connection stays usable
(a server that closes it without ``Connection: close`` makes clients reusing it fail)."""

from __future__ import annotations

import http.client
import json

import pytest
from hypothesis import HealthCheck, given, settings
from wattserve.server.settings import Settings

from support.fuzz_bodies import IDENTITY, FuzzCase, fuzz_cases, valid_data_json
from tests.servers import threaded_server

pytestmark = pytest.mark.slow  # a live server for 300 bodies (~10-30 s)

DATA_JSON = valid_data_json(IDENTITY)


@pytest.fixture(scope="module")
def identity_server():
    settings = Settings(model="identity", identity_elements=IDENTITY.count, batcher="dynamic",
                        max_batch_size=8, max_queue_delay_ms=0, warmup=False, telemetry=False)  # fmt: skip
    with threaded_server(settings) as (url, _app):
        host, port = url.removeprefix("http://").split(":")
        yield host, int(port)


@pytest.fixture(scope="module")
def connection(identity_server):
    """One keep-alive connection for the whole run, as a client library would keep it."""
    host, port = identity_server
    conn = http.client.HTTPConnection(host, port, timeout=30)
    yield conn
    conn.close()


def exchange(conn: http.client.HTTPConnection, method: str, path: str, body: bytes | None = None,
             headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:  # fmt: skip
    conn.request(method, path, body=body, headers=headers or {})
    response = conn.getresponse()
    data = response.read()
    return response.status, {k.lower(): v for k, v in response.getheaders()}, data


@settings(max_examples=300, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])  # fmt: skip
@given(case=fuzz_cases(IDENTITY, DATA_JSON))
def test_fuzzed_bodies_get_4xx_or_200_never_5xx(connection, case: FuzzCase) -> None:
    if connection.sock is None:
        connection.connect()
    sock = connection.sock
    status, headers, data = exchange(connection, "POST", "/v2/models/identity/infer", case.body, case.headers)
    deadline_passed = status == 503 and case.sets_deadline()  # the client's own deadline
    assert status < 500 or deadline_passed, f"{status} {data[:300]!r} for {case.describe()}"
    assert status == 200 or 400 <= status < 500 or deadline_passed, (
        f"unexpected {status} for {case.describe()}"
    )
    header_length = headers.get("inference-header-content-length")
    if status == 200 and header_length is not None:  # the fuzzer asked for a binary output:
        data = data[: int(header_length)]  # a JSON header, then the tensor bytes
    else:
        assert headers.get("content-type", "").startswith("application/json"), (
            f"{status} answered as {headers.get('content-type')!r}: {data[:200]!r}"
        )
    doc = json.loads(data)
    if status == 200:
        assert isinstance(doc.get("outputs"), list), doc
    else:
        assert isinstance(doc.get("error"), str) and doc["error"], doc
    assert headers.get("connection", "").lower() != "close", (
        f"{status} closed the connection: {case.describe()}"
    )
    status, _, _ = exchange(connection, "GET", "/v2/health/live")
    assert status == 200
    assert connection.sock is sock, f"connection was replaced after {case.describe()}"
