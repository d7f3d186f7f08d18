"""Triton's system shared-memory extension against a live wattserve (identity model), with
Triton's own clients (tritonclient.http, tritonclient.grpc, tritonclient.utils.shared_memory).

Where each expectation comes from:
- register / status / unregister, the status JSON shape, "already in manager", the
  out-of-bounds register ("failed to register shared memory region ... invalid args"),
  reserved and invalid keys, "Client shared memory is disabled" without --allow-client-shm:
  Triton qa/L0_shared_memory/shared_memory_test.py and src/shared_memory_manager.cc.
- inputs and outputs in shared memory, outputs answered with name/datatype/shape and no
  data: Triton's simple_http_shm_client / simple_grpc_shm_client examples and
  http_server.cc (FinalizeResponse) / grpc infer_handler.cc.
- a bad offset in an inference request: "Invalid offset + byte size for shared memory
  region" (shared_memory_manager.cc GetMemoryInfo), HTTP 400 / INVALID_ARGUMENT; an unknown
  region: "Unable to find shared memory region", NOT_FOUND (404).
- docs/protocol/extension_shared_memory.md: the extension names in server metadata.
"""

from __future__ import annotations

import uuid

import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException
from wattserve.server.settings import Settings

from tests.servers import free_port, threaded_server

ELEMENTS = 16
NBYTES = ELEMENTS * 4
IDENTITY = dict(model="identity", identity_elements=ELEMENTS, batcher="dynamic", max_batch_size=8,
                max_queue_delay_ms=1, telemetry=False)  # fmt: skip


@pytest.fixture(scope="module")
def server():
    port = free_port()
    with threaded_server(Settings(**IDENTITY, grpc_port=port, allow_client_shm=True)) as (url, app):
        yield url.removeprefix("http://"), f"127.0.0.1:{port}", app


@pytest.fixture(params=["http", "grpc"])
def client(request, server):
    http_url, grpc_url, _ = server
    c = (
        thttp.InferenceServerClient(http_url)
        if request.param == "http"
        else tgrpc.InferenceServerClient(grpc_url)
    )
    c.protocol = request.param
    yield c
    c.unregister_system_shared_memory()
    c.close()


@pytest.fixture
def regions():
    """Fresh POSIX objects (unique keys), destroyed at the end."""
    made = []

    def make(name: str, size: int = NBYTES):
        key = f"/wattserve-test-{uuid.uuid4().hex[:12]}"
        handle = shm.create_shared_memory_region(name, key, size)
        made.append(handle)
        return handle, key

    yield make
    for handle in made:
        shm.destroy_shared_memory_region(handle)


def names(client) -> list[str]:
    status = client.get_system_shared_memory_status()
    if client.protocol == "http":
        return sorted(r["name"] for r in status)
    return sorted(status.regions)


def module(client):
    return thttp if client.protocol == "http" else tgrpc


def test_metadata_advertises_the_extensions(server):
    extensions = thttp.InferenceServerClient(server[0]).get_server_metadata()["extensions"]
    assert {"system_shared_memory", "trace", "logging"} <= set(extensions)


def test_register_status_unregister(client, regions):
    _, key = regions("in0")
    client.register_system_shared_memory("in0", key, NBYTES)
    assert names(client) == ["in0"]
    if client.protocol == "http":
        assert client.get_system_shared_memory_status("in0") == [
            {"name": "in0", "key": key, "offset": 0, "byte_size": NBYTES}
        ]
    else:
        region = client.get_system_shared_memory_status("in0").regions["in0"]
        assert (region.name, region.key, region.offset, region.byte_size) == ("in0", key, 0, NBYTES)
    with pytest.raises(InferenceServerException, match="shared memory region 'in0' already in manager"):
        client.register_system_shared_memory("in0", key, NBYTES)
    client.unregister_system_shared_memory("in0")
    assert names(client) == []
    client.unregister_system_shared_memory("never-registered")  # Triton: not an error


def test_status_of_an_unknown_region(client):
    with pytest.raises(InferenceServerException, match="Unable to find system shared memory region: 'nope'"):
        client.get_system_shared_memory_status("nope")


@pytest.mark.parametrize(("size", "offset"), [(NBYTES + 1, 0), (NBYTES, 1), (1, NBYTES)])
def test_register_out_of_bounds(client, regions, size, offset):
    _, key = regions("r")
    with pytest.raises(
        InferenceServerException, match="failed to register shared memory region 'r': invalid args"
    ):
        client.register_system_shared_memory("r", key, size, offset=offset)
    assert names(client) == []


def test_register_bad_keys(client):
    with pytest.raises(
        InferenceServerException, match="Unable to open shared memory region: '/no-such-key-x'"
    ):
        client.register_system_shared_memory("r", "/no-such-key-x", 8)
    with pytest.raises(InferenceServerException, match="invalid shm key '///'"):
        client.register_system_shared_memory("r", "///", 8)
    with pytest.raises(InferenceServerException, match="reserved prefix"):
        client.register_system_shared_memory("r", "/triton_python_backend_shm_region_x", 8)
    with pytest.raises(InferenceServerException, match="Unable to open shared memory region"):
        client.register_system_shared_memory("r", "/../../etc/passwd", 8)  # never a path


def test_infer_inputs_and_outputs_in_shared_memory(client, regions):
    """Triton's simple_*_shm_client: input read from a region, output written to one."""
    m = module(client)
    in_handle, in_key = regions("in0")
    out_handle, out_key = regions("out0", 2 * NBYTES)
    data = np.arange(ELEMENTS, dtype=np.float32).reshape(1, ELEMENTS) * 1.5
    shm.set_shared_memory_region(in_handle, [data])
    client.register_system_shared_memory("in0", in_key, NBYTES)
    client.register_system_shared_memory("out0", out_key, 2 * NBYTES)

    inp = m.InferInput("INPUT0", [1, ELEMENTS], "FP32")
    inp.set_shared_memory("in0", NBYTES)
    out = m.InferRequestedOutput("OUTPUT0")
    out.set_shared_memory("out0", NBYTES, offset=NBYTES)  # the second half of the region
    result = client.infer("identity", [inp], outputs=[out])

    meta = result.get_output("OUTPUT0")
    if client.protocol == "http":
        assert meta == {"name": "OUTPUT0", "datatype": "FP32", "shape": [1, ELEMENTS]}  # no data
    else:
        assert (meta.datatype, list(meta.shape)) == ("FP32", [1, ELEMENTS])
        assert result.get_response().raw_output_contents == [b""]
    got = shm.get_contents_as_numpy(out_handle, np.float32, [2, ELEMENTS])
    np.testing.assert_array_equal(got[1], data[0])
    np.testing.assert_array_equal(got[0], 0)  # the first half untouched


def test_shared_memory_input_with_a_regular_output(client, regions):
    m = module(client)
    handle, key = regions("in0", 3 * NBYTES)
    data = np.linspace(-1, 1, ELEMENTS, dtype=np.float32).reshape(1, ELEMENTS)
    shm.set_shared_memory_region(handle, [data], offset=2 * NBYTES)
    client.register_system_shared_memory("in0", key, 2 * NBYTES, offset=NBYTES)
    inp = m.InferInput("INPUT0", [1, ELEMENTS], "FP32")
    inp.set_shared_memory("in0", NBYTES, offset=NBYTES)  # region offset + tensor offset
    np.testing.assert_array_equal(client.infer("identity", [inp]).as_numpy("OUTPUT0"), data)


def test_bad_offset_and_unknown_region_are_refused(client, regions):
    m = module(client)
    _, key = regions("in0")
    client.register_system_shared_memory("in0", key, NBYTES)
    inp = m.InferInput("INPUT0", [1, ELEMENTS], "FP32")
    inp.set_shared_memory("in0", NBYTES, offset=8)
    with pytest.raises(InferenceServerException) as bad:
        client.infer("identity", [inp])
    assert "Invalid offset + byte size for shared memory region: 'in0'" in bad.value.message()
    assert bad.value.status() == ("400" if client.protocol == "http" else "StatusCode.INVALID_ARGUMENT")

    inp.set_shared_memory("ghost", NBYTES)
    with pytest.raises(InferenceServerException) as unknown:
        client.infer("identity", [inp])
    assert "Unable to find shared memory region: 'ghost'" in unknown.value.message()
    assert unknown.value.status() == ("404" if client.protocol == "http" else "StatusCode.NOT_FOUND")


def test_output_region_too_small(client, regions):
    m = module(client)
    _, key = regions("small", 8)
    client.register_system_shared_memory("small", key, 8)
    inp = m.InferInput("INPUT0", [1, ELEMENTS], "FP32")
    inp.set_data_from_numpy(np.ones((1, ELEMENTS), np.float32))
    out = m.InferRequestedOutput("OUTPUT0")
    out.set_shared_memory("small", 8)
    with pytest.raises(InferenceServerException, match="should be at least 64 bytes to hold the results"):
        client.infer("identity", [inp], outputs=[out])


def test_json_input_with_data_and_region_is_refused(server, regions):
    import httpx

    _, key = regions("in0")
    httpx.post(f"http://{server[0]}/v2/systemsharedmemory/region/in0/register",
               json={"key": key, "offset": 0, "byte_size": NBYTES}).raise_for_status()  # fmt: skip
    body = {"inputs": [{"name": "INPUT0", "shape": [1, ELEMENTS], "datatype": "FP32", "data": [0.0] * ELEMENTS,
                        "parameters": {"shared_memory_region": "in0", "shared_memory_byte_size": NBYTES}}]}  # fmt: skip
    answer = httpx.post(f"http://{server[0]}/v2/models/identity/infer", json=body)
    assert answer.status_code == 400
    assert "Input must set only one of the following fields" in answer.json()["error"]
    httpx.post(f"http://{server[0]}/v2/systemsharedmemory/unregister").raise_for_status()


def test_registration_disabled_by_default():
    """Triton's default (--allow-client-shm=false): status answers, registering does not."""
    with threaded_server(Settings(**IDENTITY)) as (url, _):
        client = thttp.InferenceServerClient(url.removeprefix("http://"))
        assert client.get_system_shared_memory_status() == []
        with pytest.raises(InferenceServerException, match="Client shared memory is disabled") as exc:
            client.register_system_shared_memory("r", "/whatever", 8)
        assert exc.value.status() == "501"
        with pytest.raises(InferenceServerException, match="Client shared memory is disabled"):
            client.unregister_system_shared_memory()


# ---------------------------------------------------------------- CUDA shared memory
# Against a test double of the CUDA IPC backend (support/doubles/fake_cuda_ipc.py): the
# routes, registry and inference path are real; cudaIpcOpenMemHandle is simulated.
# Expectations: Triton's http_server.cc (HandleCudaSharedMemory: raw_handle.b64, device_id,
# byte_size; status with device_id) and qa/L0_cuda_shared_memory.


@pytest.fixture
def fake_cuda(server):
    from support.doubles.fake_cuda_ipc import FakeCudaIpc

    registry = server[2].state.shared_memory
    real, registry.cuda = registry.cuda, FakeCudaIpc()
    yield registry.cuda
    registry.unregister_all("cuda")
    registry.cuda = real


def test_cuda_regions_with_a_test_double(client, fake_cuda):
    import base64

    m = module(client)
    in_handle, in_memory = fake_cuda.export(NBYTES)
    out_handle, out_memory = fake_cuda.export(NBYTES, device_id=1)
    data = np.arange(ELEMENTS, dtype=np.float32).reshape(1, ELEMENTS) - 3
    in_memory[:] = data.tobytes()
    for name, handle, device in (("cin", in_handle, 0), ("cout", out_handle, 1)):
        b64 = base64.b64encode(handle)
        client.register_cuda_shared_memory(
            name, b64.decode() if client.protocol == "http" else b64, device, NBYTES
        )
    status = client.get_cuda_shared_memory_status()
    if client.protocol == "http":
        assert sorted(status, key=lambda r: r["name"]) == [
            {"name": "cin", "device_id": 0, "byte_size": NBYTES},
            {"name": "cout", "device_id": 1, "byte_size": NBYTES},
        ]
    else:
        assert sorted(status.regions) == ["cin", "cout"]
    assert names(client) == []  # not system regions

    inp = m.InferInput("INPUT0", [1, ELEMENTS], "FP32")
    inp.set_shared_memory("cin", NBYTES)
    out = m.InferRequestedOutput("OUTPUT0")
    out.set_shared_memory("cout", NBYTES)
    client.infer("identity", [inp], outputs=[out])
    np.testing.assert_array_equal(np.frombuffer(bytes(out_memory), np.float32), data[0])

    with pytest.raises(InferenceServerException, match="is registered as CUDA shared memory, not system"):
        client.get_system_shared_memory_status("cin")
    client.unregister_cuda_shared_memory()
    assert fake_cuda.open_count == 0  # every handle closed


def test_cuda_register_refusals(client, fake_cuda):
    import base64

    bogus = base64.b64encode(b"\1" * 64)
    with pytest.raises(
        InferenceServerException, match="failed to register shared memory region 'c': invalid args"
    ):
        client.register_cuda_shared_memory("c", bogus.decode() if client.protocol == "http" else bogus, 0, 8)
    handle, _ = fake_cuda.export(8)
    b64 = base64.b64encode(handle)
    with pytest.raises(InferenceServerException, match="invalid args"):  # larger than the allocation
        client.register_cuda_shared_memory("c", b64.decode() if client.protocol == "http" else b64, 0, 16)


def test_cuda_without_a_gpu_answers_triton_not_supported(client, server):
    registry = server[2].state.shared_memory
    real, registry.cuda = registry.cuda, None
    try:
        import base64

        b64 = base64.b64encode(b"\0" * 64)
        with pytest.raises(
            InferenceServerException,
            match="failed to register CUDA shared memory region: 'c', GPUs not supported",
        ):
            client.register_cuda_shared_memory("c", b64.decode() if client.protocol == "http" else b64, 0, 8)
    finally:
        registry.cuda = real
