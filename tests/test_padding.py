"""PaddedEngine: any batch size up to max runs on an engine built for a few sizes."""

from __future__ import annotations

import numpy as np
import pytest
from wattserve.engines.base import Engine, EngineError, TensorSpec
from wattserve.engines.padding import PaddedEngine, PadsBatches, padded_slots


class FixedSizeEngine:
    """A real (tiny, numpy) engine that, like a CUDA-graph bucket set, runs only its sizes."""

    platform = "numpy"
    device = "cpu"

    def __init__(self, sizes=(1, 4, 8)) -> None:
        self.name = "fixed"
        self.inputs = [TensorSpec("x", (3,))]
        self.outputs = [TensorSpec("y", (3,)), TensorSpec("norm", ())]
        self.max_batch_size = max(sizes)
        self.batch_sizes = tuple(sizes)
        self.calls: list[int] = []
        self.closed = False

    def infer(self, batch):
        x = batch["x"]
        if x.shape[0] not in self.batch_sizes:
            raise EngineError(f"size {x.shape[0]} was not built")
        self.calls.append(x.shape[0])
        return {"y": x * 2 + 1, "norm": np.linalg.norm(x, axis=1)}

    def close(self) -> None:
        self.closed = True


def test_wrapper_is_an_engine_and_pads():
    inner = FixedSizeEngine()
    eng = PaddedEngine(inner)
    assert isinstance(eng, Engine)
    assert isinstance(eng, PadsBatches)
    assert eng.max_batch_size == 8
    assert eng.batch_sizes == (1, 4, 8)
    assert [eng.padded_size(n) for n in range(1, 9)] == [1, 4, 4, 4, 8, 8, 8, 8]
    assert [padded_slots(eng, n) for n in range(1, 9)] == [0, 2, 1, 0, 3, 2, 1, 0]
    assert padded_slots(object(), 5) == 0


@pytest.mark.parametrize("n", range(1, 9))
def test_each_row_gets_its_own_result_at_every_size(n):
    inner = FixedSizeEngine()
    eng = PaddedEngine(inner)
    x = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
    out = eng.infer({"x": x})
    assert inner.calls == [eng.padded_size(n)]
    assert out["y"].shape == (n, 3)
    assert out["norm"].shape == (n,)
    np.testing.assert_array_equal(out["y"], x * 2 + 1)
    np.testing.assert_allclose(out["norm"], np.linalg.norm(x, axis=1))


def test_too_big_or_inconsistent_batches_are_engine_errors():
    eng = PaddedEngine(FixedSizeEngine())
    with pytest.raises(EngineError, match="exceeds"):
        eng.infer({"x": np.zeros((9, 3), np.float32)})
    with pytest.raises(EngineError, match="disagree"):
        eng.infer({"x": np.zeros((2, 3), np.float32), "z": np.zeros((3, 3), np.float32)})


def test_explicit_buckets_and_validation():
    inner = FixedSizeEngine(sizes=(1, 2, 4, 8))
    eng = PaddedEngine(inner, batch_sizes=[8, 2])
    assert eng.batch_sizes == (2, 8)
    eng.infer({"x": np.ones((1, 3), np.float32)})
    assert inner.calls == [2]
    with pytest.raises(ValueError, match="exceeds"):
        PaddedEngine(FixedSizeEngine(sizes=(1, 4)), batch_sizes=[16])
    no_sizes = FixedSizeEngine()
    no_sizes.batch_sizes = None
    with pytest.raises(ValueError, match="no batch_sizes"):
        PaddedEngine(no_sizes)
    eng.close()
    assert inner.closed
