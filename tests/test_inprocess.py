"""In-process inference (``server.core.inprocess``): the door ensembles and Python models'
BLS calls use. It must take the same path a front end's request takes: the model's own
batcher, its statistics, and the same 4xx/5xx kinds for bad input or an unknown model."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from prometheus_client import CollectorRegistry
from wattserve.batchers.status import Status
from wattserve.engines.registry import build_engine
from wattserve.server.core.admission import Refused
from wattserve.server.core.inprocess import infer_in_process
from wattserve.server.models.metrics import ServingMetrics
from wattserve.server.models.model_set import ModelSet
from wattserve.server.models.plan import SettingsSource
from wattserve.server.models.runtime import ModelRuntime
from wattserve.server.settings import Settings


def _model_set() -> ModelSet:
    settings = Settings(
        model="identity", batcher="dynamic", max_batch_size=8, batch_timeout_ms=20, warmup=False
    )

    def make_runtime(plan) -> ModelRuntime:
        metrics = ServingMetrics(plan.name, "dynamic", CollectorRegistry())
        return ModelRuntime(plan.serving, plan.engine_factory, metrics, name=plan.name)

    return ModelSet(SettingsSource(settings, build_engine), make_runtime, mode="explicit", startup=["*"])


async def test_in_process_calls_answer_each_its_own_input_and_batch_together():
    models = _model_set()
    await models.start()
    try:
        runtime = models.lookup("identity").runtime
        shape = runtime.engine.inputs[0].shape
        name = runtime.engine.inputs[0].name
        rows = [np.full((1, *shape), i, dtype=np.float32) for i in range(6)]
        answers = await asyncio.gather(*(infer_in_process(models, "identity", {name: r}) for r in rows))
        for row, answer in zip(rows, answers, strict=True):
            (out,) = answer.values()
            np.testing.assert_array_equal(out, row)
        stats = runtime.metrics.statistics
        assert stats.inference_count == 6
        assert stats.execution_count < 6, "concurrent in-process calls were not batched"
    finally:
        await models.stop()


async def test_in_process_refusals_carry_the_front_ends_status_kinds():
    models = _model_set()
    await models.start()
    try:
        spec = models.lookup("identity").runtime.engine.inputs[0]
        with pytest.raises(Refused) as unknown:
            await infer_in_process(models, "nope", {spec.name: np.zeros((1, *spec.shape), np.float32)})
        assert unknown.value.status is Status.NOT_FOUND
        with pytest.raises(Refused) as bad_dtype:
            await infer_in_process(models, "identity", {spec.name: np.zeros((1, *spec.shape), np.int64)})
        assert bad_dtype.value.status is Status.INVALID_ARG and "datatype" in str(bad_dtype.value)
        with pytest.raises(Refused) as bad_name:
            await infer_in_process(models, "identity", {"nope": np.zeros((1, *spec.shape), np.float32)})
        assert "unexpected input" in str(bad_name.value)
    finally:
        await models.stop()
