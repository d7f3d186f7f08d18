"""Triton's response cache (``--cache-config local,size=BYTES`` + ``response_cache { enable:
true }``): a repeated request is answered from the cache, with the bytes first computed,
without the queue or the model; errors are never stored; least recently used answers leave
at the size; Triton's statistics and ``nv_cache_*`` metrics count it. Over HTTP and gRPC on a
real server, with a real Python model (it counts its own executions in an output, so a hit
shows itself by answering the count stored, not a new one)."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tgrpc
from wattserve.server.models.repository.config import ConfigError, parse_config
from wattserve.server.models.repository.plan import plan_config
from wattserve.server.models.response_cache import ResponseCache, parse_cache_config, request_key
from wattserve.server.settings import Settings

from tests.servers import free_port, threaded_server

COUNTER = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.calls = 0

    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if x.ravel()[0] < 0:
                out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("negative input")))
                continue
            self.calls += 1
            calls = np.full((x.shape[0], 1), self.calls, dtype=np.int64)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x * 2),
                                                   pb_utils.Tensor("CALLS", calls)]))
        return out
"""
CONFIG = """backend: "python"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
         { name: "CALLS" data_type: TYPE_INT64 dims: [ 1 ] } ]
%s
"""
ENABLED = "response_cache { enable: true }"


def write(root: Path, name: str, extra: str = ENABLED) -> Path:
    (root / name / "1").mkdir(parents=True)
    (root / name / "1" / "model.py").write_text(COUNTER)
    (root / name / "config.pbtxt").write_text(CONFIG % extra)
    return root / name


def body(values: list[float]) -> dict:
    return {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [values]}]}


def infer(url: str, values: list[float], model: str = "counter") -> httpx.Response:
    return httpx.post(f"{url}/v2/models/{model}/infer", json=body(values))


def calls(response: httpx.Response) -> int:
    outputs = {o["name"]: o["data"] for o in response.json()["outputs"]}
    return int(outputs["CALLS"][0])


def cache_stats(url: str, model: str = "counter") -> dict:
    stats = httpx.get(f"{url}/v2/models/{model}/stats").json()["model_stats"][0]
    return stats


def metric(text: str, name: str, model: str = "counter") -> float:
    match = re.search(rf'^{name}{{model="{model}",version="1"}} (\S+)$', text, re.M)
    assert match, f"{name} for {model} missing"
    return float(match.group(1))


def test_cache_config_is_parsed_as_triton_writes_it():
    assert parse_cache_config("local,size=1048576") == 1048576
    for bad in ("redis,host=localhost", "local", "local,size=0", "local,size=ten", "local,size=9,ttl=3"):
        with pytest.raises(ValueError, match="cache_config"):
            parse_cache_config(bad)
    with pytest.raises(ValueError, match="redis"):
        Settings(cache_config="redis,host=localhost")


def test_the_key_covers_model_version_names_datatypes_shapes_bytes_and_outputs():
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    base = request_key("m", "1", {"INPUT0": x}, None)
    assert base == request_key("m", "1", {"INPUT0": x.copy()}, None)  # equal inputs: one key
    others = [
        request_key("n", "1", {"INPUT0": x}, None),
        request_key("m", "2", {"INPUT0": x}, None),
        request_key("m", "1", {"INPUT1": x}, None),
        request_key("m", "1", {"INPUT0": x.view(np.int32)}, None),  # same bytes, other datatype
        request_key("m", "1", {"INPUT0": x.reshape(2, 2)}, None),  # same bytes, other shape
        request_key("m", "1", {"INPUT0": x + 1}, None),
        request_key("m", "1", {"INPUT0": x}, ["OUTPUT0"]),
    ]
    assert len({base, *others}) == len(others) + 1
    a = np.array([[b"ab", b"c"]], dtype=object)
    b = np.array([[b"a", b"bc"]], dtype=object)
    assert request_key("m", "1", {"S": a}, None) != request_key("m", "1", {"S": b}, None)


def test_lru_eviction_keeps_the_cache_within_its_bytes():
    one = {"OUT": np.zeros(100, dtype=np.float32)}  # 400 bytes + bookkeeping
    cache = ResponseCache(2000)
    for key in (b"a", b"b", b"c"):
        assert cache.put(key, one)
    assert cache.get(b"a") is not None  # a is now the most recently used
    assert cache.put(b"d", one) and cache.put(b"e", one)
    assert cache.used <= cache.size and cache.evictions >= 1
    assert cache.get(b"b") is None  # the least recently used left first
    assert cache.get(b"a") is not None
    assert not cache.put(b"huge", {"OUT": np.zeros(1000, dtype=np.float32)})  # bigger than the cache
    stored = cache.get(b"a")
    assert stored is not None and not stored["OUT"].flags.writeable  # hits share read-only copies


def test_hits_skip_the_model_answer_the_same_bytes_and_are_counted_over_http_and_grpc(tmp_path):
    write(tmp_path, "counter")
    write(tmp_path, "uncached", "")
    port = free_port()
    settings = Settings(
        model_repository=tmp_path, telemetry=False, grpc_port=port, cache_config="local,size=1048576"
    )
    with threaded_server(settings) as (url, _):
        assert httpx.get(url + "/v2/models/counter/ready").status_code == 200  # READY with the cache
        assert httpx.get(url + "/v2/models/counter/config").json()["response_cache"] == {"enable": True}
        assert "response_cache" not in httpx.get(url + "/v2/models/uncached/config").json()
        first = infer(url, [1, 2, 3, 4])
        assert first.status_code == 200 and calls(first) == 1
        again = infer(url, [1, 2, 3, 4])
        assert (
            again.status_code == 200 and again.json()["outputs"] == first.json()["outputs"]
        )  # not recomputed
        assert calls(infer(url, [5, 6, 7, 8])) == 2  # other inputs: a miss, computed
        binary = httpx.post(url + "/v2/models/counter/infer", json={**body([1, 2, 3, 4]),
                            "outputs": [{"name": "OUTPUT0"}, {"name": "CALLS"}]})  # fmt: skip
        assert binary.status_code == 200 and calls(binary) == 3  # other requested outputs: another key

        client = tgrpc.InferenceServerClient(f"127.0.0.1:{port}")
        x = tgrpc.InferInput("INPUT0", [1, 4], "FP32")
        x.set_data_from_numpy(np.array([[1, 2, 3, 4]], dtype=np.float32))
        answer = client.infer("counter", [x])  # the same inputs as HTTP's first: one key, a hit
        assert answer.as_numpy("CALLS").tolist() == [[1]]
        np.testing.assert_array_equal(answer.as_numpy("OUTPUT0"), [[2, 4, 6, 8]])
        x.set_data_from_numpy(np.array([[9, 9, 9, 9]], dtype=np.float32))
        assert client.infer("counter", [x]).as_numpy("CALLS").tolist() == [[4]]
        assert client.infer("counter", [x]).as_numpy("CALLS").tolist() == [[4]]

        stats = cache_stats(url)
        inference = stats["inference_stats"]
        assert inference["cache_hit"]["count"] == 3 and inference["cache_miss"]["count"] == 4
        assert inference["success"]["count"] == 7  # hits are successes ...
        assert (
            inference["queue"]["count"] == 4 and inference["compute_infer"]["count"] == 4
        )  # ... not computed
        assert stats["inference_count"] == 4
        assert inference["cache_hit"]["ns"] > 0 and inference["cache_miss"]["ns"] > 0
        grpc_stats = client.get_inference_statistics("counter").model_stats[0].inference_stats
        assert grpc_stats.cache_hit.count == 3 and grpc_stats.cache_miss.count == 4

        # a model that does not enable it is not cached (Triton: both sides must enable it)
        assert calls(infer(url, [1, 2, 3, 4], "uncached")) == 1
        assert calls(infer(url, [1, 2, 3, 4], "uncached")) == 2
        assert cache_stats(url, "uncached")["inference_stats"]["cache_hit"]["count"] == 0

        text = httpx.get(url + "/metrics").text
        assert metric(text, "nv_cache_num_hits_per_model") == 3
        assert metric(text, "nv_cache_num_misses_per_model") == 4
        assert metric(text, "nv_cache_hit_duration_per_model") >= 0
        assert metric(text, "nv_cache_miss_duration_per_model") >= 0
        assert metric(text, "nv_cache_num_hits_per_model", "uncached") == 0
        assert metric(text, "nv_inference_count") == 4  # Triton: does not include cached requests


def test_errors_are_never_stored(tmp_path):
    write(tmp_path, "counter")
    with threaded_server(
        Settings(model_repository=tmp_path, telemetry=False, cache_config="local,size=65536")
    ) as (
        url,
        _,
    ):
        for _ in range(2):
            failed = infer(url, [-1, 0, 0, 0])
            assert failed.status_code >= 400 and "negative input" in failed.text
        inference = cache_stats(url)["inference_stats"]
        assert inference["cache_hit"]["count"] == 0 and inference["cache_miss"]["count"] == 2
        assert inference["fail"]["count"] == 2
        bad = httpx.post(url + "/v2/models/counter/infer", json={"inputs": []})  # 400 before any lookup
        assert bad.status_code == 400
        assert calls(infer(url, [1, 1, 1, 1])) == 1 and calls(infer(url, [1, 1, 1, 1])) == 1


def test_answers_leave_least_recently_used_first_at_the_size(tmp_path):
    write(tmp_path, "counter")
    # each answer: 16 + 8 bytes of tensors + names + the entry's bookkeeping; three fit, not four
    one = ResponseCache(10**6)
    one.put(b"k" * 16, {"OUTPUT0": np.zeros((1, 4), np.float32), "CALLS": np.zeros((1, 1), np.int64)})
    size = one.used * 3 + 10
    settings = Settings(model_repository=tmp_path, telemetry=False, cache_config=f"local,size={size}")
    with threaded_server(settings) as (url, _):
        for i in range(3):
            assert calls(infer(url, [i, 0, 0, 0])) == i + 1
        assert calls(infer(url, [0, 0, 0, 0])) == 1  # a hit: now the most recently used
        assert calls(infer(url, [3, 0, 0, 0])) == 4  # a fourth answer evicts the oldest unused, [1, ...]
        assert calls(infer(url, [0, 0, 0, 0])) == 1  # still cached
        assert calls(infer(url, [2, 0, 0, 0])) == 3  # still cached
        assert calls(infer(url, [1, 0, 0, 0])) == 5  # evicted: computed again


def test_a_model_that_enables_the_cache_without_one_configured_loads_and_computes(tmp_path, caplog):
    write(tmp_path, "counter")
    with threaded_server(Settings(model_repository=tmp_path, telemetry=False)) as (url, _):
        assert httpx.get(url + "/v2/models/counter/ready").status_code == 200
        assert calls(infer(url, [1, 2, 3, 4])) == 1 and calls(infer(url, [1, 2, 3, 4])) == 2
        assert "response_cache" not in httpx.get(url + "/v2/models/counter/config").json()  # what runs
        assert "nv_cache_num_hits_per_model" not in httpx.get(url + "/metrics").text
    assert any("no cache is configured" in r.getMessage() for r in caplog.records)


def test_a_decoupled_model_with_the_cache_is_refused_with_tritons_words(tmp_path):
    model = write(tmp_path, "counter", ENABLED + "\nmodel_transaction_policy { decoupled: true }")
    config = parse_config((model / "config.pbtxt").read_text())
    with pytest.raises(ConfigError, match="Response Cache does not currently support model 'counter' with "
                       "'decoupled' transaction policy"):  # fmt: skip
        plan_config(model, Settings(cache_config="local,size=4096"), config, "config.pbtxt")


def test_engine_threads_and_the_loop_share_the_cache_safely():
    """Many threads putting and getting at once: the byte count stays exact and bounded."""
    import threading

    cache = ResponseCache(20_000)
    answer = {"OUT": np.ones(50, dtype=np.float32)}
    errors: list[BaseException] = []

    def work(offset: int) -> None:
        try:
            for i in range(300):
                key = f"{offset}-{i % 40}".encode()
                cache.put(key, answer)
                got = cache.get(key)
                assert got is None or got["OUT"].shape == (50,)
        except BaseException as exc:  # surfaced below, on the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert cache.used <= cache.size
    assert cache.used == sum(cost for _, cost in cache._entries.values())


def test_a_hit_serves_every_output_form_binary_and_classification(tmp_path):
    write(tmp_path, "counter")
    settings = Settings(model_repository=tmp_path, telemetry=False, cache_config="local,size=65536")
    with threaded_server(settings) as (url, _):
        request = {**body([4, 3, 2, 1]), "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}},
                                                      {"name": "CALLS"}]}  # fmt: skip
        first = httpx.post(url + "/v2/models/counter/infer", json=request)
        hit = httpx.post(url + "/v2/models/counter/infer", json=request)
        assert first.status_code == hit.status_code == 200
        assert hit.content == first.content  # the same bytes, binary section included
        assert hit.headers["x-batch-size"] == "0"  # no batch ran
        top = {**body([4, 3, 2, 1]), "outputs": [{"name": "OUTPUT0", "parameters": {"classification": 2}},
                                                  {"name": "CALLS"}]}  # fmt: skip
        for _ in range(2):
            answer = httpx.post(url + "/v2/models/counter/infer", json=top)
            assert answer.status_code == 200, answer.text
            outputs = {o["name"]: o["data"] for o in answer.json()["outputs"]}
            assert outputs["OUTPUT0"] == ["8.000000:0", "6.000000:1"] and outputs["CALLS"] == [1]


ENSEMBLE = """platform: "ensemble"
max_batch_size: 4
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "N" data_type: TYPE_INT64 dims: [ 1 ] } ]
ensemble_scheduling { step [ { model_name: "counter" model_version: -1 input_map { key: "INPUT0" value: "X" }
  output_map { key: "OUTPUT0" value: "Y" } output_map { key: "CALLS" value: "N" } } ] }
%s
"""


def ensemble(root: Path, name: str = "top", extra: str = ENABLED) -> Path:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(ENSEMBLE % extra)
    return root / name


def test_an_ensembles_own_requests_are_cached_and_a_hit_runs_no_step_over_http_and_grpc(tmp_path):
    """Triton's L0_response_cache ensemble tests: cache enabled on the ensemble only, a repeat is
    a hit on the ensemble and runs no step (the step's model counts no new call); a composing
    model that caches its own requests hits on its own; each counts in its own statistics."""
    write(tmp_path, "counter", "")
    ensemble(tmp_path)
    port = free_port()
    settings = Settings(
        model_repository=tmp_path, telemetry=False, cache_config="local,size=65536", grpc_port=port
    )
    with threaded_server(settings) as (url, _):
        x = {"inputs": [{"name": "X", "shape": [1, 4], "datatype": "FP32", "data": [[1, 2, 3, 4]]}]}
        first = httpx.post(f"{url}/v2/models/top/infer", json=x).json()
        again = httpx.post(f"{url}/v2/models/top/infer", json=x).json()
        assert first["outputs"] == again["outputs"]  # N == 1 both times: the step ran once
        tensor = tgrpc.InferInput("X", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.array([[1, 2, 3, 4]], np.float32))
        over_grpc = tgrpc.InferenceServerClient(f"127.0.0.1:{port}").infer("top", [tensor])
        assert over_grpc.as_numpy("N").tolist() == [[1]] and over_grpc.as_numpy("Y").tolist() == [
            [2, 4, 6, 8]
        ]
        top = cache_stats(url, "top")
        assert top["inference_stats"]["cache_hit"]["count"] == 2
        assert top["inference_stats"]["cache_miss"]["count"] == 1
        assert top["inference_stats"]["success"]["count"] == 3 and top["execution_count"] == 1
        counter = cache_stats(url)["inference_stats"]
        assert counter["success"]["count"] == 1 and counter["cache_hit"]["count"] == 0
        assert httpx.get(f"{url}/v2/models/top/config").json()["response_cache"] == {"enable": True}


def test_an_answer_larger_than_the_cache_is_not_stored_and_says_so_in_tritons_words(tmp_path, caplog):
    write(tmp_path, "counter", "")
    ensemble(tmp_path)
    with threaded_server(
        Settings(model_repository=tmp_path, telemetry=False, cache_config="local,size=200")
    ) as (
        url,
        _,
    ):
        x = {"inputs": [{"name": "X", "shape": [1, 4], "datatype": "FP32", "data": [[1, 2, 3, 4]]}]}
        counts = [
            httpx.post(f"{url}/v2/models/top/infer", json=x).json()["outputs"][1]["data"] for _ in range(2)
        ]
        assert counts == [[1], [2]]  # computed twice
        stats = cache_stats(url, "top")["inference_stats"]
        assert stats["cache_hit"]["count"] == 0 and stats["cache_miss"]["count"] == 2
    assert any("Failed to insert key [" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    ("step_extra", "top_extra", "words"),
    [
        ("model_transaction_policy { decoupled: true }", ENABLED, "its step's model 'counter' is decoupled"),
        ("", ENABLED + "\nmodel_transaction_policy { decoupled: true }", "model 'top' with 'decoupled'"),
    ],
)
def test_a_cached_ensemble_that_is_decoupled_or_has_a_decoupled_step_is_refused(
    tmp_path, step_extra, top_extra, words
):
    """Triton marks an ensemble decoupled when a step's model is; a decoupled model is not
    cached: the ensemble fails to load with Triton's words (read before the step's model loads)."""
    write(tmp_path, "counter", step_extra)
    ensemble(tmp_path, extra=top_extra)
    with threaded_server(
        Settings(model_repository=tmp_path, telemetry=False, cache_config="local,size=4096")
    ) as (
        url,
        _,
    ):
        index = {m["name"]: m for m in httpx.post(url + "/v2/repository/index", json={}).json()}
        assert index["top"]["state"] == "UNAVAILABLE"
        assert (
            "Response Cache does not currently support model 'top' with 'decoupled'" in index["top"]["reason"]
        )
        assert words in index["top"]["reason"]


def test_a_stateful_model_with_the_cache_is_refused_with_tritons_words(tmp_path):
    model = write(tmp_path, "counter", ENABLED + "\nsequence_batching { }")
    config = parse_config((model / "config.pbtxt").read_text())
    with pytest.raises(ConfigError, match="Response Cache does not currently support model 'counter' with "
                       "sequence batching scheduler"):  # fmt: skip
        plan_config(model, Settings(cache_config="local,size=4096"), config, "config.pbtxt")


def serve_flags(*flags: str) -> Settings:
    from wattserve.server.cli import build_parser, settings_from_args

    return settings_from_args(build_parser().parse_args(["serve", *flags]))


def test_the_cache_flags_as_tritons_qa_gives_them(capsys):
    """Triton's L0_response_cache flag checks: the deprecated --response-cache-byte-size makes
    the local cache; --cache-config may repeat one setting at a time, but two caches are
    refused; both flags together are refused, each in Triton's words."""
    assert serve_flags("--response-cache-byte-size=8192").cache_bytes == 8192
    assert serve_flags("--cache-config=local,size=8192").cache_bytes == 8192
    assert (
        serve_flags("--cache-config", "local,size=64", "--cache-config", "local,size=8192").cache_bytes
        == 8192
    )
    assert serve_flags().cache_bytes is None
    for flags, words in (
        (["--cache-config=local,size=8192", "--cache-config=redis,key=value"], "found multiple cache configurations"),
        (["--response-cache-byte-size=12345", "--cache-config=local,size=67890"],
         "Incompatible flags --response-cache-byte-size and --cache-config both provided"),
    ):  # fmt: skip
        with pytest.raises(SystemExit) as exit_:
            serve_flags(*flags)
        assert exit_.value.code == 2 and words in capsys.readouterr().err
    assert parse_cache_config("local,size=1;local,size=2") == 2  # the variable's form of repeats
