"""Triton ensembles (``platform: "ensemble"``) through Triton's own clients.

Where each behaviour comes from:
- a step runs once its inputs exist, steps without a dependency between them run
  concurrently, the ensemble answers with the tensors mapped to its outputs:
  docs/user_guide/ensemble_models.md (the scheduler's steps 1-6);
- a request for some outputs runs only the steps they need: qa/L0_simple_ensemble
  ensemble_test.py test_ensemble_add_sub_one_output (only the version producing OUTPUT0
  counts an inference);
- each step goes through its model's own scheduler, so composing models count the requests
  too: qa/L0_metrics/metrics_queue_size_test.py test_ensemble_scheduler (ensemble and
  composing inference counts equal the requests; the ensemble's pending count is 0);
- load-time validation, with Triton's words and the step named:
  qa/L0_model_config/autofill_noplatform/ensemble/*/expected (non_existing_model,
  unreachable_input, unreachable_output_2, inconsistent_data_type, invalid_input_map, ...);
  a model that fails to load is UNAVAILABLE with its reason in the repository index:
  docs/protocol/extension_model_repository.md "Index";
- explicit model control: loading an ensemble loads the models it is composed of
  (docs/protocol/extension_model_repository.md, "unload_dependents": models loaded along
  with the requested one);
- metadata (platform "ensemble") and configuration (``ensemble_scheduling``) as Triton
  serves them: docs/protocol/extension_model_configuration.md.
"""

from __future__ import annotations

import concurrent.futures
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException
from wattserve.server.settings import Settings

from support.onnx_models import add_sub_model
from tests.conformance.tiny_models import write_model
from tests.servers import free_port, threaded_server

BASE = {"torch_threads": 1, "telemetry": False, "warmup": False}
BATCHING = "max_batch_size: 8\ndynamic_batching { max_queue_delay_microseconds: 2000 }\n"
ADD_ONE = 'platform: "onnxruntime_onnx"\n' + BATCHING  # OUTPUT0 = INPUT0 + 1, FP32 [4]
SCALE = (  # TorchScript: OUTPUT__0 = INPUT__0 * 2
    'platform: "pytorch_libtorch"\n' + BATCHING
    + 'input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
    'output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
)  # fmt: skip


def tensor(name: str, datatype: str = "TYPE_FP32", dims: str = "4") -> str:
    return f'{{ name: "{name}" data_type: {datatype} dims: [ {dims} ] }}'


def step(model: str, inputs: dict[str, str], outputs: dict[str, str], version: int = -1) -> str:
    maps = "".join(f'input_map {{ key: "{k}" value: "{v}" }} ' for k, v in inputs.items())
    maps += "".join(f'output_map {{ key: "{k}" value: "{v}" }} ' for k, v in outputs.items())
    return f'{{ model_name: "{model}" model_version: {version} {maps}}}'


def ensemble(root: Path, name: str, inputs: list[str], outputs: list[str], steps: list[str],
             max_batch_size: int = 8) -> None:  # fmt: skip
    (root / name / "1").mkdir(parents=True, exist_ok=True)
    (root / name / "config.pbtxt").write_text(
        f'platform: "ensemble"\nmax_batch_size: {max_batch_size}\n'
        f"input [ {', '.join(inputs)} ]\noutput [ {', '.join(outputs)} ]\n"
        f"ensemble_scheduling {{ step [ {', '.join(steps)} ] }}\n"
    )


def scale_model(root: Path) -> None:
    import torch

    class Scale(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2

    (root / "scale" / "1").mkdir(parents=True, exist_ok=True)
    torch.jit.script(Scale()).save(str(root / "scale" / "1" / "model.pt"))
    (root / "scale" / "config.pbtxt").write_text(SCALE)


def good_repository(root: Path) -> Path:
    write_model(root, "add_one", ADD_ONE)
    add_sub_model(root, "add_sub", "FP32", [4], 8, "dynamic_batching { }\n")
    scale_model(root)
    # chain: OUT = (IN + 1) * 2
    ensemble(root, "chain", [tensor("IN")], [tensor("OUT")], [
        step("add_one", {"INPUT0": "IN"}, {"OUTPUT0": "plus"}),
        step("scale", {"INPUT__0": "plus"}, {"OUTPUT__0": "OUT"}),
    ])  # fmt: skip
    # diamond: a = IN + 1 and b = IN * 2 (concurrent), then SUM = a + b, DIFF = a - b; PLUS = a
    ensemble(root, "diamond", [tensor("IN")], [tensor("SUM"), tensor("DIFF"), tensor("PLUS")], [
        step("add_sub", {"INPUT0": "a", "INPUT1": "b"}, {"OUTPUT0": "SUM", "OUTPUT1": "DIFF"}),
        step("add_one", {"INPUT0": "IN"}, {"OUTPUT0": "a"}),
        step("scale", {"INPUT__0": "IN"}, {"OUTPUT__0": "b"}),
        step("add_one", {"INPUT0": "b"}, {"OUTPUT0": "PLUS"}),
    ])  # fmt: skip
    # variable dims at the ensemble: a wrong length passes it and fails in step 0
    ensemble(root, "loose", [tensor("IN", dims="-1")], [tensor("OUT", dims="-1")], [
        step("add_one", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"}),
    ])  # fmt: skip
    return root


BROKEN = {  # name -> (its config's pieces, words its index reason must hold)
    "unknown_model": (
        ([tensor("IN")], [tensor("OUT")], [step("nope", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})]),
        ["contains models that are not available or ambiguous: nope", "step 0 (model 'nope')"],
    ),
    "cycle": (
        ([tensor("IN")], [tensor("OUT")], [
            step("add_sub", {"INPUT0": "IN", "INPUT1": "y"}, {"OUTPUT0": "x", "OUTPUT1": "OUT"}),
            step("add_one", {"INPUT0": "x"}, {"OUTPUT0": "y"}),
        ]),
        ["the steps form a cycle", "step 0 (model 'add_sub') -> step 1 (model 'add_one')"],
    ),
    "never_produced": (
        ([tensor("IN")], [tensor("OUT")], [step("add_one", {"INPUT0": "ghost"}, {"OUTPUT0": "OUT"})]),
        ["step 0 (model 'add_one')", "ensemble tensor 'ghost', which no step writes"],
    ),
    "unused_input": (
        ([tensor("IN"), tensor("SPARE")], [tensor("OUT")],
         [step("add_one", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})]),
        ["ensemble input 'SPARE' for ensemble 'unused_input' is not used"],
    ),
    "unwritten_output": (
        ([tensor("IN")], [tensor("OUT"), tensor("OTHER")],
         [step("add_one", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})]),
        ["output 'OTHER' for ensemble 'unwritten_output' is not written"],
    ),
    "wrong_datatype": (
        ([tensor("IN", "TYPE_INT32")], [tensor("OUT")], [step("add_one", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})]),
        ["step 0 (model 'add_one')", "ensemble tensor IN: inconsistent data type: TYPE_INT32 is inferred "
         "from model wrong_datatype while TYPE_FP32 is inferred from model add_one"],
    ),
    "wrong_shape": (
        ([tensor("IN", dims="5")], [tensor("OUT")], [step("add_one", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})]),
        ["step 0 (model 'add_one')", "inconsistent shape: [-1,5] is inferred from model wrong_shape while "
         "[-1,4] is inferred from model add_one"],
    ),
    "wrong_input_name": (
        ([tensor("IN")], [tensor("OUT")], [step("add_one", {"INPUTX": "IN"}, {"OUTPUT0": "OUT"})]),
        ["step 0 (model 'add_one')", "ensemble tensor IN is mapping to non-existing input INPUTX in "
         "model add_one"],
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = good_repository(tmp_path_factory.mktemp("ensembles"))
    for name, ((inputs, outputs, steps), _) in BROKEN.items():
        ensemble(root, name, inputs, outputs, steps)
    settings = Settings(model_repository=root, grpc_port=free_port(), **BASE)
    with threaded_server(settings) as (url, app):
        yield (thttp.InferenceServerClient(url.removeprefix("http://")),
               tgrpc.InferenceServerClient(f"127.0.0.1:{app.state.grpc.port}"), url)  # fmt: skip


def infer(client, model: str, inputs: dict[str, np.ndarray], outputs: list[str] | None = None):
    mod = thttp if isinstance(client, thttp.InferenceServerClient) else tgrpc
    tensors = []
    for name, value in inputs.items():
        t = mod.InferInput(name, list(value.shape), "FP32")
        t.set_data_from_numpy(value)
        tensors.append(t)
    wanted = [mod.InferRequestedOutput(n) for n in outputs] if outputs else None
    return client.infer(model, tensors, outputs=wanted)


def success_count(http, model: str) -> int:
    return http.get_inference_statistics(model)["model_stats"][0]["inference_stats"]["success"]["count"]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_chain_answers_both_steps_in_order(server, protocol):
    http, grpc, _ = server
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    result = infer(http if protocol == "http" else grpc, "chain", {"IN": x})
    np.testing.assert_array_equal(result.as_numpy("OUT"), (x + 1) * 2)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_diamond_joins_concurrent_branches(server, protocol):
    http, grpc, _ = server
    x = np.arange(8, dtype=np.float32).reshape(2, 4) - 3
    result = infer(http if protocol == "http" else grpc, "diamond", {"IN": x})
    np.testing.assert_array_equal(result.as_numpy("SUM"), (x + 1) + x * 2)
    np.testing.assert_array_equal(result.as_numpy("DIFF"), (x + 1) - x * 2)
    np.testing.assert_array_equal(result.as_numpy("PLUS"), x * 2 + 1)


def test_requested_outputs_run_only_the_steps_they_need(server):
    http, _, _ = server
    before = {m: success_count(http, m) for m in ("add_one", "scale", "add_sub")}
    x = np.ones((1, 4), dtype=np.float32)
    result = infer(http, "diamond", {"IN": x}, outputs=["PLUS"])
    np.testing.assert_array_equal(result.as_numpy("PLUS"), x * 2 + 1)
    assert result.as_numpy("SUM") is None
    after = {m: success_count(http, m) for m in before}
    assert after == {
        "add_one": before["add_one"] + 1,
        "scale": before["scale"] + 1,
        "add_sub": before["add_sub"],
    }


def test_concurrent_ensemble_requests_batch_in_their_steps_and_keep_their_rows(server):
    http, _, url = server
    stats = http.get_inference_statistics("add_one")["model_stats"][0]
    requests0, executions0 = stats["inference_stats"]["success"]["count"], stats["execution_count"]
    rows = [np.full((1, 4), i, dtype=np.float32) for i in range(24)]
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        # one client per thread: tritonclient.http's connection pool is not shared well
        def one(x):
            client = thttp.InferenceServerClient(url.removeprefix("http://"))
            return infer(client, "chain", {"IN": x}).as_numpy("OUT")

        answers = list(pool.map(one, rows))
    for x, out in zip(rows, answers, strict=True):
        np.testing.assert_array_equal(out, (x + 1) * 2)
    stats = http.get_inference_statistics("add_one")["model_stats"][0]
    requests = stats["inference_stats"]["success"]["count"] - requests0
    executions = stats["execution_count"] - executions0
    assert requests == 24
    assert executions < 24, "the ensemble's step requests were never batched together"


def test_ensemble_statistics_and_metrics_count_its_requests(server):
    http, _, url = server
    before = http.get_inference_statistics("chain")["model_stats"][0]
    x = np.zeros((2, 4), dtype=np.float32)
    infer(http, "chain", {"IN": x})
    stats = http.get_inference_statistics("chain")["model_stats"][0]
    assert stats["inference_stats"]["success"]["count"] == before["inference_stats"]["success"]["count"] + 1
    assert stats["inference_count"] == before["inference_count"] + 2  # rows
    assert stats["execution_count"] == before["execution_count"] + 1
    # queue and compute are its steps' (summed); they cannot exceed the end-to-end time
    spent = {k: stats["inference_stats"][k]["ns"] - before["inference_stats"][k]["ns"]
             for k in ("success", "queue", "compute_infer")}  # fmt: skip
    assert spent["compute_infer"] > 0 and spent["queue"] + spent["compute_infer"] <= spent["success"]
    text = httpx.get(url + "/metrics").text
    line = next(row for row in text.splitlines()
                if row.startswith("nv_inference_request_success{") and 'model="chain"' in row)  # fmt: skip
    assert float(line.split()[-1]) == stats["inference_stats"]["success"]["count"]
    pending = next(row for row in text.splitlines()
                   if row.startswith("nv_inference_pending_request_count{") and 'model="chain"' in row)  # fmt: skip
    assert float(pending.split()[-1]) == 0


def test_metadata_and_config_describe_the_ensemble(server):
    http, grpc, _ = server
    meta = http.get_model_metadata("chain")
    assert meta["platform"] == "ensemble"
    assert [(t["name"], t["datatype"], t["shape"]) for t in meta["inputs"]] == [("IN", "FP32", [-1, 4])]
    assert [t["name"] for t in meta["outputs"]] == ["OUT"]
    config = http.get_model_config("chain")
    assert config["platform"] == "ensemble" and config["max_batch_size"] == 8
    steps = config["ensemble_scheduling"]["step"]
    assert [s["model_name"] for s in steps] == ["add_one", "scale"]
    assert steps[1]["input_map"] == {"INPUT__0": "plus"}
    grpc_config = grpc.get_model_config("chain", as_json=True)["config"]
    assert [s["model_name"] for s in grpc_config["ensemble_scheduling"]["step"]] == ["add_one", "scale"]
    assert grpc.get_model_metadata("chain", as_json=True)["platform"] == "ensemble"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_failing_step_fails_the_request_with_its_message(server, protocol):
    http, grpc, _ = server
    client = http if protocol == "http" else grpc
    with pytest.raises(InferenceServerException) as info:
        infer(client, "loose", {"IN": np.zeros((1, 3), dtype=np.float32)})
    message = info.value.message()
    assert "in ensemble 'loose', step 0 (model 'add_one')" in message
    assert "INPUT0" in message  # the step's own words about its input
    assert info.value.status() == ("400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT")
    # the good path of the same ensemble still serves
    x = np.zeros((1, 4), dtype=np.float32)
    np.testing.assert_array_equal(infer(client, "loose", {"IN": x}).as_numpy("OUT"), x + 1)


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_a_bad_graph_is_unavailable_with_a_reason_naming_the_step(server, name):
    http, grpc, _ = server
    index = {m["name"]: m for m in http.get_model_repository_index()}
    assert index[name]["state"] == "UNAVAILABLE"
    for words in BROKEN[name][1]:
        assert words in index[name]["reason"], index[name]["reason"]
    assert not http.is_model_ready(name)
    with pytest.raises(InferenceServerException):
        infer(grpc, name, {"IN": np.zeros((1, 4), dtype=np.float32)})
    assert http.is_server_ready()  # the good models serve on


def test_explicit_mode_loads_what_an_ensemble_is_made_of(tmp_path):
    root = good_repository(tmp_path)
    settings = Settings(model_repository=root, model_control_mode="explicit", load_model=["chain"], **BASE)
    with threaded_server(settings) as (url, _app):
        http = thttp.InferenceServerClient(url.removeprefix("http://"))
        states = {m["name"]: m.get("state") for m in http.get_model_repository_index()}
        assert states["chain"] == states["add_one"] == states["scale"] == "READY"
        assert states["add_sub"] != "READY"  # not part of chain: not loaded
        x = np.ones((1, 4), dtype=np.float32)
        np.testing.assert_array_equal(infer(http, "chain", {"IN": x}).as_numpy("OUT"), (x + 1) * 2)
        http.load_model("diamond")  # a load request loads add_sub along
        assert http.is_model_ready("add_sub")
        np.testing.assert_array_equal(infer(http, "diamond", {"IN": x}).as_numpy("PLUS"), x * 2 + 1)
