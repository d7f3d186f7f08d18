"""The Python backend's pieces without a server: pb_utils semantics a model.py relies on,
the config as Triton's JSON, refusals that name what is unsupported, and one execute per
batch with each request whole (the batcher's RunsRequests path)."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
import torch
from wattserve.batchers.dynamic import DynamicBatcher
from wattserve.batchers.types import WorkItem
from wattserve.engines.python_backend import pb_utils
from wattserve.engines.request_engines import RunsRequests
from wattserve.server.models.repository.config import ConfigError
from wattserve.server.models.repository.plan import plan_model
from wattserve.server.settings import Settings

from support.python_models import write_python_model


def test_tensor_shares_memory_and_speaks_dlpack():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    tensor = pb_utils.Tensor("X", x)
    assert tensor.name() == "X" and tensor.as_numpy() is x and tensor.shape() == [2, 3]
    t = torch.utils.dlpack.from_dlpack(tensor.to_dlpack())
    t[0, 0] = 42  # same memory, no copy
    assert x[0, 0] == 42
    back = pb_utils.Tensor.from_dlpack("Y", torch.ones(2, dtype=torch.int64))
    assert back.as_numpy().tolist() == [1, 1] and back.triton_dtype() == "INT64"
    strings = pb_utils.Tensor("S", np.array(["a", "bc"]))
    assert strings.as_numpy().dtype == object and strings.as_numpy().tolist() == [b"a", b"bc"]
    with pytest.raises(pb_utils.TritonModelException, match="BYTES"):
        strings.to_dlpack()


def test_datatypes_errors_and_config_lookups():
    assert pb_utils.triton_string_to_numpy("TYPE_FP32") is np.float32
    assert pb_utils.triton_string_to_numpy("TYPE_STRING") is np.object_
    error = pb_utils.TritonError("nope", pb_utils.TritonError.NOT_FOUND)
    assert error.message() == "nope" and error.code() == 2
    assert pb_utils.InferenceResponse(error=error).has_error()
    config = {"input": [{"name": "A"}], "output": [{"name": "B", "data_type": "TYPE_INT32"}]}
    assert pb_utils.get_output_config_by_name(config, "B")["data_type"] == "TYPE_INT32"
    assert pb_utils.get_input_config_by_name(config, "Z") is None
    packed = pb_utils.serialize_byte_tensor(np.array([b"ab", b""], dtype=object))
    assert pb_utils.deserialize_bytes_tensor(packed.tobytes()).tolist() == [b"ab", b""]


def test_initialize_gets_tritons_args_and_config_json(tmp_path):
    folder = write_python_model(tmp_path, "add_sub")
    (plan,) = plan_model(folder, Settings(telemetry=False, python_model_isolation="thread"))
    engine = plan.engine_factory(plan.serving.engine)
    try:
        args = engine.instance.args
        assert set(args) == {"model_config", "model_instance_kind", "model_instance_name",
                             "model_instance_device_id", "model_repository", "model_version", "model_name"}  # fmt: skip
        assert args["model_name"] == "add_sub" and args["model_version"] == "1"
        assert args["model_instance_kind"] == "CPU" and args["model_repository"] == str(folder)
        config = json.loads(args["model_config"])
        assert config["max_batch_size"] == 0 and config["input"][0]["dims"] == [4]  # numbers, not strings
        assert isinstance(engine, RunsRequests)
    finally:
        engine.close()


def test_execution_env_path_is_refused_by_name(tmp_path):
    folder = write_python_model(tmp_path, "add_sub")
    config = folder / "config.pbtxt"
    config.write_text(config.read_text() + 'parameters { key: "EXECUTION_ENV_PATH" value: '
                      '{ string_value: "$$TRITON_MODEL_DIRECTORY/env.tar.gz" } }\n')  # fmt: skip
    with pytest.raises(ConfigError, match="EXECUTION_ENV_PATH"):
        plan_model(folder, Settings(telemetry=False))


@pytest.mark.parametrize("isolation", ["process", "thread"])
async def test_one_execute_per_batch_each_request_whole(tmp_path, isolation):
    folder = write_python_model(tmp_path, "identity")
    (plan,) = plan_model(folder, Settings(telemetry=False, python_model_isolation=isolation))
    engine = plan.engine_factory(plan.serving.engine)

    class Context:
        def __init__(self, rid: str) -> None:
            self.id, self.outputs = rid, None

    batcher = DynamicBatcher([engine], DynamicBatcher.config_from(plan.serving.batching, engine))
    task = asyncio.create_task(batcher.run())
    try:
        items = []
        for i, rows in enumerate((1, 3, 2)):
            item = WorkItem(inputs={"INPUT0": np.full((rows, 2), i, np.float32)}, rows=rows)
            item.context = Context(f"ext-{i}")
            items.append(item)
        results = await asyncio.gather(*(batcher.submit(item) for item in items))
        for item, result in zip(items, results, strict=True):
            np.testing.assert_array_equal(result.outputs["OUTPUT0"], item.inputs["INPUT0"])
            assert result.outputs["BATCH"].shape == (item.rows, 1)
        assert max(int(r.outputs["BATCH"][0, 0]) for r in results) > 1  # requests, not rows
    finally:
        await batcher.drain()
        await task
        batcher.close()


def test_using_decoupled_model_transaction_policy_reads_the_config_json():
    assert pb_utils.using_decoupled_model_transaction_policy(
        {"model_transaction_policy": {"decoupled": True}}
    )
    assert not pb_utils.using_decoupled_model_transaction_policy({"model_transaction_policy": {}})
    assert not pb_utils.using_decoupled_model_transaction_policy({})
