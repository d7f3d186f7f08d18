"""Triton's trace and logging extensions against a live wattserve (identity model), with
Triton's own clients (tritonclient.http, tritonclient.grpc).

Where each expectation comes from:
- settings shapes (strings for rate/count/frequency, a level list, trace_mode "triton"),
  model settings falling back to global ones field by field, a null/empty value clearing a
  field, "trace file location can not be updated through network protocol", "Request for
  unknown model : <m>", "Expect only one trace level 'OFF' is specified": Triton
  qa/L0_trace/trace_endpoint_test.py and http_server.cc / grpc_server.cc (HandleTrace).
- log settings shape and updates, "log file location can not be updated through network
  protocol", "invalid argument for --log_format": Triton qa/L0_logging/
  logging_endpoint_test.py and http_server.cc (HandleLogging).
- restricted-API groups "trace" and "logging": Triton docs/customization_guide/inference_protocols.md
  (--http-restricted-api / --grpc-restricted-protocol) and qa/L0_http restricted tests.
"""

from __future__ import annotations

import logging

import httpx
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from google.protobuf import json_format
from tritonclient.utils import InferenceServerException
from wattserve.server.settings import Settings

from tests.servers import free_port, threaded_server

IDENTITY = dict(model="identity", identity_elements=16, telemetry=False)
DEFAULT_TRACE = {"trace_file": "", "trace_level": ["OFF"], "trace_rate": "1000", "trace_count": "-1",
                 "log_frequency": "0", "trace_mode": "triton"}  # fmt: skip
DEFAULT_LOG = {"log_file": "", "log_info": True, "log_warning": True, "log_error": True,
               "log_verbose_level": 0, "log_format": "default"}  # fmt: skip
CLEAR_TRACE = {"trace_level": None, "trace_rate": None, "trace_count": None, "log_frequency": None}


@pytest.fixture(scope="module")
def server():
    port = free_port()
    with threaded_server(Settings(**IDENTITY, grpc_port=port)) as (url, _):
        yield url.removeprefix("http://"), f"127.0.0.1:{port}"


@pytest.fixture
def http(server):
    client = thttp.InferenceServerClient(server[0])
    yield client
    client.update_trace_settings(model_name="identity", settings=CLEAR_TRACE)
    client.update_trace_settings(settings=CLEAR_TRACE)
    client.update_log_settings(DEFAULT_LOG | {"log_file": None})


@pytest.fixture
def grpc(server, http):
    client = tgrpc.InferenceServerClient(server[1])
    yield client
    client.close()


def as_dict(response) -> dict:
    """A gRPC TraceSettingResponse as HTTP's JSON (one value: a string; trace_level: a list)."""
    return {k: list(v.value) if k == "trace_level" else v.value[0] for k, v in response.settings.items()}


def test_trace_settings_defaults_and_model_fallback(http):
    assert http.get_trace_settings() == DEFAULT_TRACE
    assert http.get_trace_settings(model_name="identity") == DEFAULT_TRACE
    model = http.update_trace_settings(model_name="identity", settings={"trace_rate": "5"})
    assert model == DEFAULT_TRACE | {"trace_rate": "5"}
    glob = http.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "7"})
    assert glob == DEFAULT_TRACE | {"trace_level": ["TIMESTAMPS"], "trace_rate": "7"}
    # the model keeps its own rate and follows the global level
    assert http.get_trace_settings(model_name="identity") == DEFAULT_TRACE | {"trace_level": ["TIMESTAMPS"],
                                                                            "trace_rate": "5"}  # fmt: skip
    cleared = http.update_trace_settings(model_name="identity", settings={"trace_rate": None})
    assert cleared["trace_rate"] == "7"  # back to the global value


def test_trace_settings_refusals(http):
    with pytest.raises(InferenceServerException, match="trace file location can not be updated"):
        http.update_trace_settings(settings={"trace_file": "x.log"})
    with pytest.raises(InferenceServerException, match="Request for unknown model : ghost"):
        http.get_trace_settings(model_name="ghost")
    with pytest.raises(InferenceServerException, match="Expect only one trace level 'OFF' is specified"):
        http.update_trace_settings(settings={"trace_level": ["OFF", "TIMESTAMPS"]})
    with pytest.raises(InferenceServerException, match="Unable to parse 'trace_rate', got: fast"):
        http.update_trace_settings(settings={"trace_rate": "fast"})
    with pytest.raises(InferenceServerException, match="Expecting value >= -1"):
        http.update_trace_settings(settings={"trace_count": "-2"})
    assert http.get_trace_settings() == DEFAULT_TRACE  # nothing half-applied


def test_trace_settings_over_grpc(grpc):
    assert as_dict(grpc.get_trace_settings()) == DEFAULT_TRACE
    updated = grpc.update_trace_settings(model_name="identity", settings={"trace_level": ["TIMESTAMPS"]})
    assert as_dict(updated) == DEFAULT_TRACE | {"trace_level": ["TIMESTAMPS"]}
    assert as_dict(grpc.get_trace_settings()) == DEFAULT_TRACE  # global unchanged
    cleared = grpc.update_trace_settings(model_name="identity", settings={"trace_level": None})
    assert as_dict(cleared) == DEFAULT_TRACE
    with pytest.raises(InferenceServerException, match="Request for unknown model : ghost") as exc:
        grpc.get_trace_settings(model_name="ghost")
    assert exc.value.status() == "StatusCode.INVALID_ARGUMENT"


def test_log_settings_over_http_drive_python_logging(http):
    assert http.get_log_settings() == DEFAULT_LOG
    with pytest.raises(InferenceServerException, match="log file location can not be updated") as exc:
        http.update_log_settings({"log_file": "x.log"})
    assert exc.value.status() == "501"  # Triton: UNSUPPORTED
    with pytest.raises(InferenceServerException, match="invalid argument for --log_format, got: xml"):
        http.update_log_settings({"log_format": "xml"})

    handler = logging.StreamHandler()  # stands for the server's console handler
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        updated = http.update_log_settings(
            {"log_info": False, "log_verbose_level": 1, "log_format": "ISO8601"}
        )
        assert updated == DEFAULT_LOG | {"log_info": False, "log_verbose_level": 1, "log_format": "ISO8601"}

        def passes(level: int) -> bool:
            record = logging.LogRecord("wattserve.x", level, __file__, 1, "m", None, None)
            return bool(handler.filter(record))

        assert (passes(logging.INFO), passes(logging.WARNING), passes(logging.ERROR)) == (False, True, True)
        assert root.level == logging.DEBUG  # verbose: DEBUG records pass the root logger
        assert handler.formatter is None or handler.formatter.datefmt == "%Y-%m-%dT%H:%M:%SZ"
        http.update_log_settings({"log_info": True, "log_verbose_level": 0, "log_format": "default"})
        assert passes(logging.INFO) and root.level >= logging.INFO
    finally:
        root.removeHandler(handler)


def test_log_settings_over_grpc(grpc):
    def expected(**changes) -> object:  # as Triton's logging_endpoint_test builds it
        doc = DEFAULT_LOG | changes
        settings = {k: {"boolParam": v} if isinstance(v, bool) else {"uint32Param": v} if isinstance(v, int)
                    else {"stringParam": v} for k, v in doc.items()}  # fmt: skip
        return json_format.ParseDict({"settings": settings}, tgrpc.service_pb2.LogSettingsResponse())

    assert grpc.get_log_settings() == expected()
    assert grpc.update_log_settings({"log_warning": False}) == expected(log_warning=False)
    with pytest.raises(InferenceServerException, match="log file location can not be updated") as exc:
        grpc.update_log_settings({"log_file": "x.log"})
    assert exc.value.status() == "StatusCode.UNIMPLEMENTED"


def test_restricted_api_groups():
    """Triton's restricted-API groups cover the new endpoints on both protocols."""
    port = free_port()
    settings = Settings(**IDENTITY, grpc_port=port, allow_client_shm=True,
                        restricted_api="shared-memory,trace,logging:admin=s3cret")  # fmt: skip
    with threaded_server(settings) as (url, _):
        for path in ("/v2/logging", "/v2/trace/setting", "/v2/models/identity/trace/setting",
                     "/v2/systemsharedmemory/status", "/v2/cudasharedmemory/status"):  # fmt: skip
            assert httpx.get(url + path).status_code == 403, path
            assert httpx.get(url + path, headers={"admin": "s3cret"}).status_code == 200, path
        client = tgrpc.InferenceServerClient(f"127.0.0.1:{port}")
        for call in (client.get_log_settings, client.get_trace_settings, client.get_system_shared_memory_status,
                     client.get_cuda_shared_memory_status):  # fmt: skip
            with pytest.raises(InferenceServerException, match="This protocol is restricted"):
                call()
            call(headers={"triton-grpc-protocol-admin": "s3cret"})
        client.close()
