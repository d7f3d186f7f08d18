"""One server, a Triton-layout repository of models on three platforms (ONNX Runtime,
TorchScript, a built-in) and a broken one: Triton's own client gets what the engines
compute when run directly; the repository extension (index, load, unload, stats) works on
the live server; unloading under load loses no accepted request."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import onnxruntime as ort
import pytest
import torch
import tritonclient.http as triton
from wattserve.server.settings import Settings

from support.model_repository import IMAGE, make_repository
from tests.servers import threaded_server


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    return make_repository(tmp_path_factory.mktemp("repo"), identity_delay_ms=5)


@pytest.fixture(scope="module")
def server(repository):
    # explicit mode with every model loaded: the load/unload tests below need a client to be
    # allowed to change the set (the default, none, refuses it as Triton does)
    settings = Settings(model_repository=repository, torch_threads=1, max_queue_delay_ms=1,
                        model_control_mode="explicit", load_model=["*"])  # fmt: skip
    with threaded_server(settings) as (url, app):
        yield url, app


def client(url: str) -> triton.InferenceServerClient:
    return triton.InferenceServerClient(url.removeprefix("http://"))


def infer(url: str, model: str, name: str, x: np.ndarray, binary: bool = True) -> np.ndarray:
    tensor = triton.InferInput(name, list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=binary)
    result = client(url).infer(model, [tensor])
    return result.as_numpy(result.get_response()["outputs"][0]["name"])


def test_three_platforms_answer_what_their_engines_compute(server, repository):
    url, _ = server
    x = np.random.default_rng(3).standard_normal((3, *IMAGE), dtype=np.float32)
    session = ort.InferenceSession(str(repository / "squeeze_onnx/1/model.onnx"))
    (onnx_ref,) = session.run(None, {"image": x})
    scripted = torch.jit.load(str(repository / "squeeze_ts/1/model.pt"))
    with torch.inference_mode():
        ts_ref = scripted(torch.from_numpy(x)).numpy()

    onnx_got = infer(url, "squeeze_onnx", "image", x)
    ts_got = infer(url, "squeeze_ts", "INPUT__0", x, binary=False)
    np.testing.assert_allclose(onnx_got, onnx_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ts_got, ts_ref, rtol=1e-5, atol=1e-5)
    assert np.abs(ts_ref).max() > 1e-3  # not a trivially zero network
    ident = np.arange(32, dtype=np.float32).reshape(2, 16)
    np.testing.assert_array_equal(infer(url, "identity", "INPUT0", ident), ident)


def test_metadata_and_config_come_from_the_repository(server):
    url, _ = server
    c = client(url)
    meta = c.get_model_metadata("squeeze_onnx")
    assert meta["platform"] == "onnxruntime_onnx"
    assert meta["inputs"] == [
        {"name": "image", "datatype": "FP32", "shape": [-1, 3, 64, 64]}
    ]  # from the file
    config = c.get_model_config("squeeze_onnx")
    assert config["dynamic_batching"]["preferred_batch_size"] == [4]
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 2000
    ts = c.get_model_config("squeeze_ts")
    assert ts["parameters"]["batcher"]["string_value"] == "continuous"  # pinned in parameters
    assert ts["instance_group"][0]["count"] == 2


def test_broken_model_beside_good_ones(server):
    url, _ = server
    c = client(url)
    assert c.is_server_ready()
    assert c.is_model_ready("squeeze_onnx") and c.is_model_ready("identity")
    assert not c.is_model_ready("broken")
    r = httpx.get(url + "/v2/models/broken/ready")
    assert r.status_code == 400
    assert "model.onnx" in r.json()["error"] or "onnx" in r.json()["error"].lower()
    r = httpx.post(url + "/v2/models/broken/infer", json={"inputs": []})
    assert r.status_code == 400 and "not available" in r.json()["error"]
    index = {m["name"]: m for m in c.get_model_repository_index()}
    assert index["broken"]["state"] == "UNAVAILABLE" and index["broken"]["reason"]
    assert index["squeeze_ts"]["state"] == "READY"
    assert sorted(index) == ["broken", "identity", "squeeze_onnx", "squeeze_ts"]


def test_statistics_count_what_was_served(server):
    url, _ = server
    before = client(url).get_inference_statistics("identity")["model_stats"][0]
    x = np.ones((1, 16), np.float32)
    for _ in range(3):
        infer(url, "identity", "INPUT0", x)
    stats = client(url).get_inference_statistics("identity")["model_stats"][0]
    assert stats["name"] == "identity" and stats["version"] == "1"
    success = stats["inference_stats"]["success"]
    assert success["count"] == before["inference_stats"]["success"]["count"] + 3
    assert success["ns"] > 0 and stats["inference_stats"]["queue"]["count"] == success["count"]
    assert stats["inference_stats"]["compute_infer"]["ns"] >= 3 * 5_000_000  # identity sleeps 5 ms
    assert stats["execution_count"] >= 3
    assert sum(b["compute_infer"]["count"] for b in stats["batch_stats"]) == stats["execution_count"]
    everything = httpx.get(url + "/v2/models/stats").json()["model_stats"]
    assert {s["name"] for s in everything} == {"identity", "squeeze_onnx", "squeeze_ts"}


def test_metrics_carry_the_model_label(server):
    url, _ = server
    text = httpx.get(url + "/metrics").text
    for model in ("identity", "squeeze_onnx", "squeeze_ts"):
        assert 'wattserve_model_ready{batcher="' in text
        assert f'model="{model}"' in text


def test_unload_then_load(server):
    url, _ = server
    c = client(url)
    c.unload_model("squeeze_onnx")
    assert not c.is_model_ready("squeeze_onnx")
    r = httpx.post(url + "/v2/models/squeeze_onnx/infer", json={"inputs": []})
    assert r.status_code == 400 and "unloaded" in r.json()["error"]
    index = {m["name"]: m for m in c.get_model_repository_index()}
    assert index["squeeze_onnx"]["state"] == "UNAVAILABLE"
    assert c.is_model_ready("identity")  # the others kept serving
    c.load_model("squeeze_onnx")
    assert c.is_model_ready("squeeze_onnx")
    x = np.zeros((1, *IMAGE), np.float32)
    assert infer(url, "squeeze_onnx", "image", x).shape == (1, 10)
    with pytest.raises(Exception, match="no model"):
        c.load_model("nope")


def test_unloading_under_load_loses_no_accepted_request(server):
    """Requests race an unload: each is either computed (200, its own answer) or refused
    before it was accepted (503 draining/unloading, or 400 once unloaded) - never failed
    after acceptance, never left unanswered."""
    url, _ = server

    async def scenario():
        answers: list[tuple[int, int, dict]] = []
        unloaded = asyncio.Event()
        async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=64)) as http:

            async def sender(first: int) -> None:  # keeps requests in flight until after the unload
                i = first
                while not unloaded.is_set() or i < first + 4000:
                    data = [float(i)] * 16
                    body = {
                        "inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": data}]
                    }
                    r = await http.post(url + "/v2/models/identity/infer", json=body)
                    answers.append((i, r.status_code, r.json()))
                    if unloaded.is_set() and r.status_code == 400:
                        return  # unloaded for good
                    i += 1

            senders = [asyncio.create_task(sender(k * 10_000)) for k in range(24)]
            while len(answers) < 100:  # noqa: ASYNC110 - polling a list the senders fill
                await asyncio.sleep(0.01)
            unload = await http.post(url + "/v2/repository/models/identity/unload")
            unloaded.set()
            await asyncio.wait_for(asyncio.gather(*senders), 60)
            return unload, answers

    unload, answers = asyncio.run(scenario())
    try:
        assert unload.status_code == 200
        computed = [(i, doc) for i, status, doc in answers if status == 200]
        refused = [(status, doc["error"]) for _, status, doc in answers if status != 200]
        assert len(computed) >= 100 and refused  # the race happened
        for i, doc in computed:
            assert doc["outputs"][0]["data"] == [float(i)] * 16
        for status, error in refused:
            assert status in (400, 503), (status, error)
            assert "stopped before" not in error  # an accepted request dropped by a drain timeout
            assert any(w in error for w in ("draining", "unloading", "unloaded", "not available")), error
    finally:
        client(url).load_model("identity")


def test_wattserve_serve_with_a_repository_drains_on_sigterm(repository):
    """Started as a user would (WATTSERVE_MODEL_REPOSITORY); SIGTERM drains every model."""
    from tests.servers import wattserve_process

    proc = wattserve_process({"WATTSERVE_MODEL_REPOSITORY": str(repository), "WATTSERVE_TORCH_THREADS": "1",
                              "WATTSERVE_TELEMETRY": "false"}).start()  # fmt: skip
    try:
        proc.wait_ready()
        index = httpx.post(proc.url + "/v2/repository/index", json={"ready": True}).json()
        assert sorted(m["name"] for m in index) == ["identity", "squeeze_onnx", "squeeze_ts"]
        assert "broken" in proc.log() and "not ready" in proc.log()  # the failure is logged with why
    finally:
        code = proc.stop()
    assert code == 0, proc.log()


def test_statistics_without_a_version_list_every_loaded_version(tmp_path):
    """Triton's statistics for a model named without a version: each loaded version, oldest
    first (its L0_response_cache reads versions 1 and 3 of a model as model_stats[0] and [1])."""
    from support.model_repository import IDENTITY_CONFIG

    (tmp_path / "two").mkdir()
    (tmp_path / "two" / "config.pbtxt").write_text(
        IDENTITY_CONFIG + "version_policy { specific { versions: [ 1, 3 ] } }\n"
    )
    for version in ("1", "2", "3"):
        (tmp_path / "two" / version).mkdir()
    with threaded_server(Settings(model_repository=tmp_path, telemetry=False)) as (url, _):
        infer(url, "two", "INPUT0", np.ones((1, 16), np.float32))  # the newest version serves it
        stats = client(url).get_inference_statistics("two")["model_stats"]
        assert [(s["name"], s["version"]) for s in stats] == [("two", "1"), ("two", "3")]
        assert [s["inference_stats"]["success"]["count"] for s in stats] == [0, 1]
        only = client(url).get_inference_statistics("two", "1")["model_stats"]
        assert [s["version"] for s in only] == ["1"]
