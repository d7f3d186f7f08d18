"""Tiny repository models for the conformance tests, built in milliseconds.

An ONNX graph ``OUTPUT0 = INPUT0 + 1`` (FP32, 4 elements per row, first dim dynamic or fixed)
made with onnx.helper, so a test can write fresh repositories and load files over the
repository API without exporting a network.
"""

from __future__ import annotations

from pathlib import Path

from onnx import TensorProto, helper

from support.onnx_models import graph_model

ELEMENTS = 4


def add_one_onnx(batch_dim: str | int = "n") -> bytes:
    """``OUTPUT0 = INPUT0 + 1``; ``batch_dim``: a name (dynamic first dim) or a fixed size."""
    shape = [batch_dim, ELEMENTS]
    one = helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])
    model = graph_model(
        [helper.make_node("Add", ["INPUT0", "one"], ["OUTPUT0"])],
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, shape)],
        "add_one",
        initializer=[one],
    )
    return model.SerializeToString()


ONNX_CONFIG = 'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n'


def write_model(root: Path, name: str, config: str | None = ONNX_CONFIG, versions: tuple[int, ...] = (1,),
                batch_dim: str | int = "n") -> Path:  # fmt: skip
    """``root/name``: config.pbtxt (unless None) and model.onnx in each version folder."""
    model_dir = root / name
    for version in versions:
        (model_dir / str(version)).mkdir(parents=True, exist_ok=True)
        (model_dir / str(version) / "model.onnx").write_bytes(add_one_onnx(batch_dim))
    if config is not None:
        (model_dir / "config.pbtxt").write_text(config)
    return model_dir
