"""``--frontend-workers 2``: two front-end processes over one engine core, started as a user
starts them (``python -m wattserve serve``), driven by real clients on loopback.

Every accepted request gets exactly one answer, computed from its own input, whichever
front end and protocol carried it; the server looks like one (metrics, statistics, model
control, shared memory); a killed front end takes only its own requests (counted by the
core), a killed core makes the front ends answer 503 and report not ready until it is
back; SIGTERM drains both kinds in order.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import re
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.servers import free_port, wattserve_process

pytestmark = pytest.mark.slow

ELEMENTS = 16


def split_server(tmp_path: Path | None = None, **settings: str):
    env = {
        "WATTSERVE_MODEL": "identity",
        "WATTSERVE_FRONTEND_WORKERS": "2",
        "WATTSERVE_IDENTITY_ELEMENTS": str(ELEMENTS),
        "WATTSERVE_LOG_LEVEL": "warning",
        **{f"WATTSERVE_{k.upper()}": v for k, v in settings.items()},
    }
    return wattserve_process(env)


def children(proc, role: str) -> list[psutil.Process]:
    found = []
    for child in psutil.Process(proc.pid).children():
        try:
            if child.cmdline()[-1] == role:
                found.append(child)
        except psutil.Error:
            continue
    return found


def listening_front_ends(proc, *ports: int) -> int:
    """How many front ends listen on every one of ``ports`` (a front end counted as started
    may not have bound yet, and the kernel spreads connections only over listeners)."""
    count = 0
    for child in children(proc, "frontend"):
        try:
            sockets = getattr(child, "net_connections", child.connections)(kind="tcp")
        except psutil.Error:
            continue
        bound = {s.laddr.port for s in sockets if s.status == psutil.CONN_LISTEN}
        count += all(port in bound for port in ports)
    return count


def body(values: np.ndarray) -> bytes:
    doc = {"inputs": [{"name": "INPUT0", "shape": list(values.shape), "datatype": "FP32",
                       "data": values.ravel().tolist()}]}  # fmt: skip
    return json.dumps(doc).encode()


def post(url: str, values: np.ndarray, timeout: float = 60) -> tuple[int, np.ndarray | str]:
    """One request on a new connection (so requests spread over the front ends)."""
    request = urllib.request.Request(
        url + "/v2/models/identity/infer", data=body(values), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            doc = json.loads(reply.read())
            return reply.status, np.array(doc["outputs"][0]["data"], dtype=np.float32).reshape(values.shape)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def metric(url: str, name: str, **labels: str) -> float:
    _, text = get(url + "/metrics")
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def accepted(url: str) -> float:
    """Requests the core holds: queued or in a running batch."""
    return metric(url, "wattserve_queue_depth") + metric(url, "wattserve_inflight_requests")


def assert_own_answers(results, values) -> None:
    """Every request answered 200 carries its own input back."""
    for (status, out), value in zip(results, values, strict=True):
        if status == 200:
            np.testing.assert_array_equal(out, value)


def wait_for(condition, timeout_s: float = 60.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_every_request_answered_once_with_its_own_rows_over_both_front_ends():
    """HTTP JSON, HTTP binary and gRPC at once, 16 clients: each answer equals its own
    input; /metrics and the statistics extension count exactly what the clients sent."""
    grpc_port = free_port()
    with split_server(grpc_port=str(grpc_port), identity_delay_ms="2", max_queue_size="1024") as proc:
        assert len(children(proc, "frontend")) == 2 and len(children(proc, "core")) == 1
        url = proc.url
        wait_for(
            lambda: listening_front_ends(proc, proc.port, grpc_port) == 2, what="both front ends listening"
        )

        def client(index: int) -> int:
            rng = np.random.default_rng(index)
            sent = 0
            http = httpclient.InferenceServerClient(url.removeprefix("http://"))
            grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
            for i in range(12):
                values = rng.standard_normal((1 + i % 3, ELEMENTS)).astype(np.float32)
                kind = (index + i) % 3
                if kind == 0:
                    status, out = post(url, values)
                    assert status == 200, out
                elif kind == 1:
                    tensor = httpclient.InferInput("INPUT0", list(values.shape), "FP32")
                    tensor.set_data_from_numpy(values, binary_data=True)
                    wanted = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
                    out = http.infer("identity", [tensor], outputs=[wanted]).as_numpy("OUTPUT0")
                else:
                    tensor = grpcclient.InferInput("INPUT0", list(values.shape), "FP32")
                    tensor.set_data_from_numpy(values)
                    out = grpc.infer("identity", [tensor]).as_numpy("OUTPUT0")
                np.testing.assert_array_equal(out, values)  # its own rows, whatever the batch
                sent += 1
            grpc.close()
            return sent

        with cf.ThreadPoolExecutor(16) as pool:
            sent = sum(pool.map(client, range(16)))
        assert sent == 16 * 12
        assert metric(url, "wattserve_requests_total", model="identity", outcome="success") == sent
        _, stats = get(url + "/v2/models/identity/stats")
        assert json.loads(stats)["model_stats"][0]["inference_stats"]["success"]["count"] == sent
        # a bad body, refused by whichever front end read it, is counted by the core too: the
        # count travels to the core in a frame written after the 400 goes out, so a scrape
        # that follows the answer at once may come before it (a scrape sees it later, once)
        status, _ = post(url, np.zeros((1, 3), dtype=np.float32))
        assert status == 400
        bad = lambda: metric(url, "wattserve_requests_total", model="identity", outcome="bad_request")  # noqa: E731
        wait_for(lambda: bad() >= 1, 10.0, "the bad body's count in the core")
        assert bad() == 1
        # the kernel spread the connections: each front end decoded some, HTTP and gRPC alike
        served = [metric(url, "wattserve_frontend_requests_total", frontend=str(i)) for i in (1, 2)]
        assert sum(served) == sent and min(served) > 0, served  # the bad body never left its front end


def test_a_small_slab_wraps_under_load_and_every_answer_is_still_its_own():
    """16 KB rows through a 1 MiB slab: blocks are reused many times over while other
    requests' answers are still being encoded from theirs; each answer equals its input."""
    elements = 4096
    with split_server(identity_elements=str(elements), frontend_slab_mib="1", identity_delay_ms="1",
                      max_queue_size="1024") as proc:  # fmt: skip
        url = proc.url

        def client(index: int) -> int:
            rng = np.random.default_rng(100 + index)
            http = httpclient.InferenceServerClient(url.removeprefix("http://"))
            for i in range(20):
                values = rng.standard_normal((1 + i % 3, elements)).astype(np.float32)
                tensor = httpclient.InferInput("INPUT0", list(values.shape), "FP32")
                tensor.set_data_from_numpy(values, binary_data=True)
                wanted = httpclient.InferRequestedOutput("OUTPUT0", binary_data=i % 2 == 0)
                out = http.infer("identity", [tensor], outputs=[wanted]).as_numpy("OUTPUT0")
                np.testing.assert_array_equal(out, values)
            return 20

        with cf.ThreadPoolExecutor(16) as pool:
            assert sum(pool.map(client, range(16))) == 320
        assert metric(url, "wattserve_requests_total", model="identity", outcome="success") == 320


def test_a_killed_front_end_takes_only_its_own_requests_and_is_restarted():
    with split_server(identity_delay_ms="300", max_batch_size="4", max_queue_delay_ms="0") as proc:
        url = proc.url
        values = [np.full((1, ELEMENTS), i, dtype=np.float32) for i in range(12)]
        with cf.ThreadPoolExecutor(12) as pool:
            futures = [pool.submit(post, url, v, 60) for v in values]
            wait_for(
                lambda: accepted(url) >= 8 or all(f.done() for f in futures), what="requests in the core"
            )
            frontends = children(proc, "frontend")
            holding = max(frontends, key=lambda p: len([c for c in p.net_connections("tcp")
                                                         if c.status == "ESTABLISHED"]))  # fmt: skip
            held = len([c for c in holding.net_connections("tcp") if c.status == "ESTABLISHED"])
            holding.send_signal(signal.SIGKILL)
            results = [f.result() if f.exception() is None else (None, repr(f.exception())) for f in futures]
        failed = [r for r in results if r[0] != 200]
        assert_own_answers(results, values)
        assert failed and all(r[0] is None for r in failed), failed  # a reset, never a wrong answer
        assert len(failed) == held
        lost = metric(url, "wattserve_frontend_lost_requests_total")
        assert lost == len(failed)
        wait_for(lambda: len(children(proc, "frontend")) == 2 and holding.pid not in
                 [p.pid for p in children(proc, "frontend")], what="the front end restarted")  # fmt: skip
        for i in range(8):
            assert post(url, np.full((1, ELEMENTS), 100 + i, dtype=np.float32))[0] == 200


def test_a_killed_core_answers_503_and_is_not_ready_until_it_is_back():
    with split_server(identity_delay_ms="300", max_batch_size="4", max_queue_delay_ms="0") as proc:
        url = proc.url
        values = [np.full((1, ELEMENTS), i, dtype=np.float32) for i in range(8)]
        with cf.ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(post, url, v, 60) for v in values]
            wait_for(lambda: metric(url, "wattserve_inflight_requests") >= 1, what="a batch running")
            core = children(proc, "core")[0]
            core.send_signal(signal.SIGKILL)
            results = [f.result() for f in futures]
        statuses = sorted({status for status, _ in results})
        assert set(statuses) <= {200, 503} and 503 in statuses, results  # one answer each
        assert_own_answers(results, values)
        assert get(url + "/v2/health/ready")[0] == 503
        assert get(url + "/v2/health/live")[0] == 200
        wait_for(lambda: get(url + "/v2/health/ready")[0] == 200, 120, "the core back")
        assert children(proc, "core")[0].pid != core.pid
        assert post(url, values[0])[0] == 200


def test_sigterm_drains_every_accepted_request_then_exits():
    with split_server(identity_delay_ms="200", max_batch_size="4", max_queue_delay_ms="0") as proc:
        url = proc.url
        values = [np.full((1, ELEMENTS), i, dtype=np.float32) for i in range(8)]
        with cf.ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(post, url, v, 60) for v in values]
            wait_for(lambda: accepted(url) >= 8, what="every request accepted")
            proc.terminate()
            results = [f.result() for f in futures]
        assert all(status == 200 for status, _ in results), results
        assert_own_answers(results, values)
        assert proc.proc.wait(60) == 0


IDENTITY = """backend: "wattserve"
max_batch_size: 16
dynamic_batching { }
parameters { key: "builtin" value: { string_value: "identity" } }
parameters { key: "identity_elements" value: { string_value: "16" } }
"""


def test_model_control_and_shared_memory_are_the_core_s_whatever_front_end_asks(tmp_path):
    """Unload and load through one connection are seen by requests on every other; a
    system shared-memory region registered over HTTP serves a request over gRPC."""
    import tritonclient.utils.shared_memory as shm

    (tmp_path / "identity").mkdir()
    (tmp_path / "identity" / "config.pbtxt").write_text(IDENTITY)
    grpc_port = free_port()
    with split_server(model_repository=str(tmp_path), model_control_mode="explicit", load_model="identity",
                      allow_client_shm="true",
                      grpc_port=str(grpc_port)) as proc:  # fmt: skip
        url = proc.url
        x = np.arange(ELEMENTS, dtype=np.float32).reshape(1, ELEMENTS)
        assert all(post(url, x)[0] == 200 for _ in range(6))  # both front ends know the model
        http = httpclient.InferenceServerClient(url.removeprefix("http://"))
        http.unload_model("identity")
        assert {post(url, x)[0] for _ in range(6)} == {400}  # unloaded, on every front end
        http.load_model("identity")
        for _ in range(6):  # a reloaded model: each front end describes it again
            status, out = post(url, x)
            assert status == 200
            np.testing.assert_array_equal(out, x)

        handle = shm.create_shared_memory_region("split_in", "/wattserve_split_in", x.nbytes)
        out_handle = shm.create_shared_memory_region("split_out", "/wattserve_split_out", x.nbytes)
        try:
            shm.set_shared_memory_region(handle, [x])
            http.register_system_shared_memory("split_in", "/wattserve_split_in", x.nbytes)
            http.register_system_shared_memory("split_out", "/wattserve_split_out", x.nbytes)
            grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
            assert {r["name"] for r in grpc.get_system_shared_memory_status(as_json=True)["regions"].values()} \
                == {"split_in", "split_out"}  # fmt: skip
            tensor = grpcclient.InferInput("INPUT0", [1, ELEMENTS], "FP32")
            tensor.set_shared_memory("split_in", x.nbytes)
            wanted = grpcclient.InferRequestedOutput("OUTPUT0")
            wanted.set_shared_memory("split_out", x.nbytes)
            grpc.infer("identity", [tensor], outputs=[wanted])
            out = shm.get_contents_as_numpy(out_handle, np.float32, [1, ELEMENTS])
            np.testing.assert_array_equal(out, x)
            # and over HTTP, which a front end hands to the core whole
            tensor = httpclient.InferInput("INPUT0", [1, ELEMENTS], "FP32")
            tensor.set_shared_memory("split_in", x.nbytes)
            shm.set_shared_memory_region(out_handle, [np.zeros_like(x)])
            wanted = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
            wanted.set_shared_memory("split_out", x.nbytes)
            http.infer("identity", [tensor], outputs=[wanted])
            np.testing.assert_array_equal(shm.get_contents_as_numpy(out_handle, np.float32, [1, ELEMENTS]), x)
            http.unregister_system_shared_memory()
            grpc.close()
        finally:
            shm.destroy_shared_memory_region(handle)
            shm.destroy_shared_memory_region(out_handle)
        assert re.search(r"wattserve_requests_total\{", get(url + "/metrics")[1])


def send(url: str, path: str, data: bytes) -> tuple[int, str]:
    request = urllib.request.Request(url + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_a_forwarded_body_over_the_limit_is_refused_as_one_process_refuses_it(tmp_path):
    """A request a front end forwards is judged by the core's own route, body limit included:
    the same status and message at one front end and at two (Triton's L0_http load and
    generate tests read the message), not a refusal of the front end's own wording."""
    (tmp_path / "identity").mkdir()
    (tmp_path / "identity" / "config.pbtxt").write_text(IDENTITY)
    limit = 64 * 1024
    load = json.dumps({"parameters": {"file:1/model.onnx": "A" * limit}}).encode()
    generate = json.dumps({"INPUT0": [0.0] * limit}).encode()
    answers = {}
    for workers in ("1", "2"):
        with split_server(model_repository=str(tmp_path), model_control_mode="explicit", load_model="identity",
                          max_body_bytes=str(limit), frontend_workers=workers) as proc:  # fmt: skip
            answers[workers] = [
                send(proc.url, "/v2/repository/models/identity/load", load),
                send(proc.url, "/v2/models/identity/generate", generate),
            ]
    assert [status for status, _ in answers["1"]] == [413, 413]
    assert answers["2"] == answers["1"]
