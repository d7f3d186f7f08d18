"""TensorRT engine without a GPU: clean EngineUnavailable, plan cache, profile dispatch.

This machine has neither TensorRT nor a GPU. The first tests run against the real (absent)
libraries. The rest use FakeTensorRT/FakePycuda (support/doubles/fake_tensorrt.py), test
doubles that mirror the TensorRT 10 / pycuda calls the engine makes and compute with ONNX
Runtime, to check the engine's own logic: which profiles it builds, when it reuses a cached
plan, which context runs a batch, padding, copies and slicing. Real TensorRT runs only in
scripts/gpu_check.sh.
"""

from __future__ import annotations

import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from wattserve.engines.base import Engine, EngineError, EngineUnavailable
from wattserve.engines.profiles import parse_profiles, select_profile
from wattserve.engines.tensorrt_engine import (
    GpuIdentity,
    TensorRTEngine,
    build_plan,
    cuda_device_index,
    import_pycuda,
    import_tensorrt,
    load_or_build_plan,
)
from wattserve.server.cli import main as cli_main
from wattserve.server.settings import Settings

from support.doubles import fake_tensorrt

DEFAULT = "1:1:1,2:4:8,8:16:32"
RNG = np.random.default_rng(3)
W = RNG.standard_normal((4, 3)).astype(np.float32)
B = RNG.standard_normal(3).astype(np.float32)


@pytest.fixture
def tiny_onnx(tmp_path):
    """input [batch, 4] -> logits [batch, 3] = input @ W + B (rows independent)."""
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 3])
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["input", "W", "B"], ["logits"])],
        "tiny",
        [x],
        [y],
        initializer=[numpy_helper.from_array(W, "W"), numpy_helper.from_array(B, "B")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "tiny.onnx"
    onnx.save(model, str(path))
    return path


# ------------------------------------------------------------------ the real, absent libraries


def test_missing_tensorrt_is_a_clear_engine_unavailable(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    with pytest.raises(EngineUnavailable, match=r"TensorRT is not installed.*wattserve\[tensorrt\]"):
        import_tensorrt()
    with pytest.raises(EngineUnavailable, match="TensorRT is not installed"):
        TensorRTEngine.from_config(Settings(engine="tensorrt").engine_config())
    with pytest.raises(EngineUnavailable, match="TensorRT is not installed"):
        TensorRTEngine(b"plan", name="m")


def test_missing_pycuda_is_a_clear_engine_unavailable(monkeypatch):
    monkeypatch.setitem(sys.modules, "pycuda", None)
    monkeypatch.setitem(sys.modules, "pycuda.driver", None)
    with pytest.raises(EngineUnavailable, match="pycuda is not installed"):
        import_pycuda()


def build_engine_cli(argv: list[str]) -> int:
    """``wattserve build-engine ARGV``, in process (the doubles are installed here)."""
    return cli_main(["build-engine", *argv])


def test_build_engine_cli_says_why_it_cannot_run(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    assert build_engine_cli(["--model", "mobilenet_v2"]) == 2
    assert "TensorRT is not installed" in capsys.readouterr().out


def test_device_index():
    assert cuda_device_index("auto") == 0
    assert cuda_device_index("cuda") == 0
    assert cuda_device_index("cuda:3") == 3
    with pytest.raises(EngineUnavailable, match="CUDA GPU"):
        cuda_device_index("cpu")


# ------------------------------------------------------------------ with the test doubles


def test_no_gpu_is_a_clear_engine_unavailable(monkeypatch):
    fake_tensorrt.install(monkeypatch, gpus=0)
    with pytest.raises(EngineUnavailable, match="no CUDA GPU"):
        import_pycuda()


def test_build_sets_every_profile_fp16_and_timing_cache(monkeypatch, tiny_onnx, tmp_path):
    trt, _ = fake_tensorrt.install(monkeypatch)
    cache = tmp_path / "timing.cache"
    plan = build_plan(tiny_onnx, parse_profiles(DEFAULT), fp16=True, timing_cache=cache)
    assert plan
    (build,) = trt.builds
    assert build["profiles"] == [
        {"input": [[1, 4], [1, 4], [1, 4]]},
        {"input": [[2, 4], [4, 4], [8, 4]]},
        {"input": [[8, 4], [16, 4], [32, 4]]},
    ]
    assert int(trt.BuilderFlag.FP16) in build["flags"]
    assert cache.read_bytes() == b'["build-1"]'
    build_plan(tiny_onnx, parse_profiles("1:2:4"), fp16=False, timing_cache=cache)
    assert trt.builds[1]["flags"] == []
    # the second build started from the first one's timing cache and added to it
    assert cache.read_bytes() == b'["build-1", "build-2"]'


def test_tensorrt_11_is_refused_with_the_pin_named(monkeypatch, tiny_onnx):
    """Pinned to TensorRT 10: 11 has no BuilderFlag.FP16, so it is refused up front."""
    fake_tensorrt.install(monkeypatch, version="11.0.0", fp16=False)
    with pytest.raises(EngineUnavailable, match=r"written for TensorRT 10.*tensorrt-cu12>=10,<11"):
        build_plan(tiny_onnx, parse_profiles(DEFAULT), fp16=True, timing_cache=None)
    with pytest.raises(EngineUnavailable, match="written for TensorRT 10"):
        import_tensorrt()


def test_a_stubs_only_tensorrt_is_not_taken_for_tensorrt(monkeypatch):
    import types

    monkeypatch.setitem(sys.modules, "tensorrt", types.ModuleType("tensorrt"))  # no __version__
    with pytest.raises(EngineUnavailable, match="not TensorRT"):
        import_tensorrt()


def test_unparseable_onnx_is_an_engine_error(monkeypatch, tmp_path):
    _trt, _ = fake_tensorrt.install(monkeypatch)
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not onnx")
    with pytest.raises(EngineError, match="could not parse"):
        build_plan(bad, parse_profiles(DEFAULT), fp16=False, timing_cache=None)


def test_plan_cache_hits_and_misses(monkeypatch, tiny_onnx, tmp_path):
    trt, _ = fake_tensorrt.install(monkeypatch)
    gpu = GpuIdentity("NVIDIA H200", "9.0")

    def plan(profiles=DEFAULT, fp16=True, gpu=gpu):
        return load_or_build_plan(
            tiny_onnx,
            parse_profiles(profiles),
            model="tiny",
            gpu=gpu,
            fp16=fp16,
            cache_dir=tmp_path / "cache",
        )

    first = plan()
    assert first.built and first.path.exists()
    assert first.path.with_suffix(".json").exists()
    again = plan()
    assert not again.built and again.path == first.path
    assert len(trt.builds) == 1
    others = [plan(fp16=False), plan(profiles="1:1:1,2:4:8"), plan(gpu=GpuIdentity("A100", "8.0"))]
    assert all(r.built for r in others)
    assert len({r.path for r in [first, *others]}) == 4
    assert len(trt.builds) == 4
    # the ONNX graph changing (re-export) must miss too
    model = onnx.load(str(tiny_onnx))
    model.graph.initializer[1].raw_data = (B + 1).tobytes()
    onnx.save(model, str(tiny_onnx))
    assert plan().built


@pytest.fixture
def trt_engine(monkeypatch, tiny_onnx, tmp_path):
    def make(profiles: str = DEFAULT):
        _trt, driver = fake_tensorrt.install(monkeypatch)
        record = load_or_build_plan(
            tiny_onnx,
            parse_profiles(profiles),
            model="tiny",
            gpu=GpuIdentity("Fake", "9.0"),
            fp16=False,
            cache_dir=tmp_path / profiles.replace(":", "-"),
        )
        engine = TensorRTEngine(
            record.path.read_bytes(), name="tiny", expected_profiles=parse_profiles(profiles)
        )
        return engine, driver

    return make


def test_engine_contract_and_profiles_read_back(trt_engine):
    engine, driver = trt_engine()
    assert isinstance(engine, Engine)
    assert engine.platform == "tensorrt" and engine.device == "cuda:0"
    assert engine.profiles == parse_profiles(DEFAULT)
    assert engine.max_batch_size == 32
    assert engine.batch_sizes is None  # the profiles cover every size 1..32
    assert engine.preferred_batch_sizes == [1, 4, 16]
    assert [(s.name, s.shape, s.datatype) for s in engine.inputs] == [("input", (4,), "FP32")]
    assert [(s.name, s.shape) for s in engine.outputs] == [("logits", (3,))]
    assert driver.context_stack == []


def test_every_batch_runs_on_its_profile_with_correct_rows(trt_engine):
    engine, driver = trt_engine()
    contexts = engine._engine.contexts
    assert [c.profile for c in contexts] == [0, 1, 2]
    for n in range(1, 33):
        x = RNG.standard_normal((n, 4)).astype(np.float32)
        out = engine.infer({"input": x})
        np.testing.assert_allclose(out["logits"], x @ W + B, rtol=1e-5, atol=1e-5)
        index, _ = select_profile(n, engine.profiles)
        assert contexts[index].executions[-1] == (index, n)
        assert engine.padded_size(n) == n  # no profile gap: never padded
    assert sum(len(c.executions) for c in contexts) == 32
    assert driver.context_stack == []


def test_batches_in_a_gap_are_padded_and_sliced(trt_engine):
    engine, _ = trt_engine("1:1:2,8:8:8")
    assert engine.batch_sizes == [1, 2, 8]
    assert engine.max_batch_size == 8
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    out = engine.infer({"input": x})
    assert out["logits"].shape == (3, 3)
    np.testing.assert_allclose(out["logits"], x @ W + B, rtol=1e-5, atol=1e-5)
    assert engine._engine.contexts[1].executions == [(1, 8)]
    assert engine.padded_size(3) == 8


def test_bad_batches_are_engine_errors(trt_engine):
    engine, driver = trt_engine()
    with pytest.raises(EngineError, match="exceeds"):
        engine.infer({"input": np.zeros((33, 4), np.float32)})
    with pytest.raises(EngineError, match="missing inputs"):
        engine.infer({"image": np.zeros((2, 4), np.float32)})
    with pytest.raises(EngineError, match="items are"):
        engine.infer({"input": np.zeros((2, 5), np.float32)})
    assert driver.context_stack == []


def test_close_frees_device_memory(trt_engine):
    engine, driver = trt_engine()
    assert driver.allocations and not any(a.freed for a in driver.allocations)
    engine.close()
    assert all(a.freed for a in driver.allocations)
    assert all(h.freed for h in driver.host_allocations)
    engine.close()  # idempotent
    with pytest.raises(EngineError, match="closed"):
        engine.infer({"input": np.zeros((1, 4), np.float32)})


def test_cuda_resources_live_and_die_on_the_engine_thread(trt_engine):
    """The stream, buffers and context are created and released on the one thread that owns
    the context, with it current, whichever threads call infer and close (the batcher's
    worker thread infers; the server's lifespan closes)."""
    import gc
    import threading
    from concurrent.futures import ThreadPoolExecutor

    engine, driver = trt_engine()
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    with ThreadPoolExecutor(2) as pool:  # two other threads infer
        outs = list(pool.map(lambda _: engine.infer({"input": x})["logits"], range(4)))
    for out in outs:
        np.testing.assert_allclose(out, x @ W + B, rtol=1e-5, atol=1e-5)
    closer = threading.Thread(target=engine.close)  # and yet another closes
    closer.start()
    closer.join()
    gc.collect()
    (context,) = driver.contexts
    assert len(context.pushed_on) == 1 and context.detached  # pushed once, on the owner thread
    (owner,) = context.pushed_on
    released = {r["what"] for r in driver.releases}
    assert released == {"device memory", "pinned host memory", "stream"}
    assert all(r["thread"] == owner and r["current"] == r["device"] == 0 for r in driver.releases)
    assert driver.errors == []
    assert owner not in (threading.get_ident(), closer.ident)


def test_profile_selection_failure_raises_in_tensorrt_10_and_is_unavailable(trt_engine, monkeypatch):
    engine, driver = trt_engine()
    sys.modules["tensorrt"].fail_profile_select = True  # the double fake_tensorrt.install put there
    plan = engine._engine.plan
    import json

    with pytest.raises(EngineUnavailable, match=r"could not select optimization profile 0.*set optimization"):
        TensorRTEngine(json.dumps(plan).encode(), name="tiny")
    # what it had allocated before failing was released, on its own thread, in its context
    assert all(r["current"] == r["device"] for r in driver.releases) and driver.errors == []


def test_bad_plan_and_profile_mismatch_are_unavailable(trt_engine, monkeypatch):
    engine, _ = trt_engine()
    with pytest.raises(EngineUnavailable, match="could not deserialize"):
        TensorRTEngine(b"garbage", name="tiny")
    plan = engine._engine.plan
    import json

    with pytest.raises(EngineUnavailable, match="differ from the requested"):
        TensorRTEngine(json.dumps(plan).encode(), name="tiny", expected_profiles=parse_profiles("1:2:4"))


def test_from_config_builds_then_reuses_the_plan(monkeypatch, tiny_onnx, tmp_path):
    trt, _ = fake_tensorrt.install(monkeypatch)
    settings = Settings(
        engine="tensorrt",
        model="tiny",
        onnx_path=tiny_onnx,
        cache_dir=tmp_path,
        device="cuda:0",
        max_batch_size=16,
        trt_profiles="1:1:1,2:8:16",
    )
    engine = TensorRTEngine.from_config(settings.engine_config())
    assert engine.plan.built
    assert trt.builds[0]["device"] == 0  # built with cuda:0's context current
    assert engine.max_batch_size == 16
    x = RNG.standard_normal((5, 4)).astype(np.float32)
    np.testing.assert_allclose(engine.infer({"input": x})["logits"], x @ W + B, rtol=1e-5, atol=1e-5)
    again = TensorRTEngine.from_config(settings.engine_config())
    assert not again.plan.built
    assert len(trt.builds) == 1
    too_big = settings.model_copy(update={"max_batch_size": 32})
    with pytest.raises(EngineUnavailable, match="exceeds the TensorRT profiles"):
        TensorRTEngine.from_config(too_big.engine_config())
    with pytest.raises(EngineUnavailable, match="not on device 'cpu'"):
        TensorRTEngine.from_config(settings.model_copy(update={"device": "cpu"}).engine_config())


def test_plan_is_built_on_the_configured_gpu(monkeypatch, tiny_onnx, tmp_path):
    trt, driver = fake_tensorrt.install(monkeypatch, gpus=2)
    settings = Settings(engine="tensorrt", model="tiny", onnx_path=tiny_onnx, cache_dir=tmp_path,
                        device="cuda:1", max_batch_size=4, trt_profiles="1:2:4")  # fmt: skip
    engine = TensorRTEngine.from_config(settings.engine_config())
    assert engine.device == "cuda:1" and engine.plan.built
    assert [b["device"] for b in trt.builds] == [1]  # TensorRT builds on the current device
    assert [c.device_index for c in driver.contexts] == [1]
    engine.close()
    argv = ["--model", "tiny", "--onnx", str(tiny_onnx), "--cache-dir", str(tmp_path / "cli"),
            "--profiles", "1:2:4", "--device", "cuda:1"]  # fmt: skip
    assert build_engine_cli(argv) == 0
    assert [b["device"] for b in trt.builds] == [1, 1]  # the CLI too


def test_build_engine_cli_builds_then_finds_the_cached_plan(monkeypatch, tiny_onnx, tmp_path, capsys):
    fake_tensorrt.install(monkeypatch)
    argv = ["--model", "tiny", "--onnx", str(tiny_onnx), "--cache-dir", str(tmp_path), "--profiles", "1:2:4"]
    assert build_engine_cli([*argv, "--fp16"]) == 0
    assert "built in" in capsys.readouterr().out
    assert build_engine_cli([*argv, "--fp16"]) == 0
    out = capsys.readouterr().out
    assert "found in cache" in out and '"precision": "fp16"' in out
    assert build_engine_cli(argv) == 0
    assert "built in" in capsys.readouterr().out
