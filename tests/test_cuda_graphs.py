"""CUDA-graph runner: buckets, padding, copy-out and slicing, on CPU with a capture double.

No GPU here, so capture itself is replaced by FakeCapture (support/doubles/fake_cuda_graphs.py),
which keeps a graph's contract (replay rewrites the static output from the static input).
The real capture runs in scripts/gpu_check.sh.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from wattserve.engines.base import Engine, EngineError, EngineUnavailable
from wattserve.engines.cuda_graphs import CudaGraphEngine, CudaGraphRunner
from wattserve.server.settings import Settings

from support.doubles.fake_cuda_graphs import FakeCapture


def small_net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3),
        torch.nn.BatchNorm2d(4),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(4, 5),
    ).eval()


def test_without_cuda_capture_is_unavailable():
    with pytest.raises(EngineUnavailable, match="need a CUDA device"):
        CudaGraphRunner(small_net(), (3, 8, 8), [1, 2], "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(EngineUnavailable, match="no CUDA device"):
            CudaGraphRunner(small_net(), (3, 8, 8), [1, 2], "cuda")


def test_one_graph_per_bucket_and_rows_match_eager():
    net = small_net()
    capture = FakeCapture()
    runner = CudaGraphRunner(net, (3, 8, 8), [4, 1, 2], "cpu", capture=capture)
    assert runner.buckets == [1, 2, 4]
    assert sorted(capture.graphs) == [1, 2, 4]
    assert [runner.padded_size(n) for n in (1, 2, 3, 4)] == [1, 2, 4, 4]
    for n in (1, 2, 3, 4):
        x = torch.randn(n, 3, 8, 8)
        with torch.no_grad():
            expected = net(x)
        before = capture.graphs[runner.padded_size(n)].replays
        got = runner(x)
        assert capture.graphs[runner.padded_size(n)].replays == before + 1
        assert got.shape == (n, 5)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="exceeds"):
        runner(torch.randn(5, 3, 8, 8))
    with pytest.raises(ValueError, match="captured for"):
        runner(torch.randn(1, 3, 9, 9))


def test_padding_repeats_last_row_and_results_survive_the_next_replay():
    capture = FakeCapture()
    runner = CudaGraphRunner(small_net(), (3, 8, 8), [4], "cpu", capture=capture)
    x = torch.randn(3, 3, 8, 8)
    first = runner(x)
    static_input = capture.graphs[4].static_input
    torch.testing.assert_close(static_input[3], x[2])
    kept = first.clone()
    runner(torch.randn(2, 3, 8, 8))  # same bucket, static output rewritten
    torch.testing.assert_close(first, kept)


@pytest.mark.slow
def test_engine_wraps_the_torch_engine(monkeypatch):
    from wattserve.engines.torch_engine import TorchVisionEngine

    torch_engine = TorchVisionEngine("mobilenet_v2", device="cpu", max_batch_size=4)
    capture = FakeCapture()
    engine = CudaGraphEngine(torch_engine, [1, 4], capture=capture)
    assert isinstance(engine, Engine)
    assert engine.batch_sizes == (1, 4) and engine.max_batch_size == 4
    assert engine.padded_size(3) == 4  # bucket 4: one padded row
    x = np.random.default_rng(0).standard_normal((3, 3, 224, 224)).astype(np.float32)
    got = engine.infer({"input": x})["logits"]
    ref = torch_engine.infer({"input": x})["logits"]
    assert got.shape == (3, 1000)
    assert np.abs(got - ref).max() <= 1e-4 * np.abs(ref).max()
    assert capture.graphs[4].static_input.is_contiguous(memory_format=torch.channels_last)
    with pytest.raises(EngineError, match="missing input"):
        engine.infer({"image": x})
    with pytest.raises(EngineError, match="exceeds"):
        engine.infer({"input": np.zeros((5, 3, 224, 224), np.float32)})
    settings = Settings(max_batch_size=8, engine_batch_sizes="1,4")
    with pytest.raises(EngineUnavailable, match="do not reach"):
        CudaGraphEngine.from_config(torch_engine, settings.engine_config())
