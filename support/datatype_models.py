"""One tiny ONNX model per Triton datatype, in a Triton-layout repository, for tests.

Each model ``dt_<type>`` (as Triton's QA ``onnx_<type>_<type>_<type>`` models) has inputs
INPUT0 and INPUT1 ``[-1, 4]`` and outputs OUTPUT0 = INPUT0 (Identity) and OUTPUT1 = a
elementwise combination ONNX Runtime's CPU provider has a kernel for: Add for numbers,
Or for BOOL, and Add computed in FP32 for BF16 (no BF16 Add kernel on CPU).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper
from wattserve.engines.base import DATATYPE_TO_NUMPY

from support.onnx_models import ONNX_TYPES as ELEMENT_TYPES
from support.onnx_models import graph_model

# Triton datatype -> (ONNX element type, numpy dtype the server holds it as): the numeric
# ones, from the project's two tables (support.onnx_models, engines.base)
ONNX_TYPES: dict[str, tuple[int, np.dtype]] = {
    datatype: (elem, DATATYPE_TO_NUMPY[datatype])
    for datatype, elem in ELEMENT_TYPES.items()
    if datatype != "BYTES"
}
WIDTH = 4


def combine(datatype: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """What OUTPUT1 of ``dt_<datatype>`` computes, in numpy (wrapping integer overflow)."""
    if datatype == "BOOL":
        return a | b
    if datatype == "BF16":
        return (a.astype(np.float32) + b.astype(np.float32)).astype(a.dtype)
    return a + b


def datatype_model(datatype: str) -> onnx.ModelProto:
    elem, _ = ONNX_TYPES[datatype]
    shape = [None, WIDTH]
    inputs = [helper.make_tensor_value_info(n, elem, shape) for n in ("INPUT0", "INPUT1")]
    outputs = [helper.make_tensor_value_info(n, elem, shape) for n in ("OUTPUT0", "OUTPUT1")]
    nodes = [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])]
    if datatype == "BOOL":
        nodes.append(helper.make_node("Or", ["INPUT0", "INPUT1"], ["OUTPUT1"]))
    elif datatype == "BF16":
        nodes += [
            helper.make_node("Cast", ["INPUT0"], ["A"], to=TensorProto.FLOAT),
            helper.make_node("Cast", ["INPUT1"], ["B"], to=TensorProto.FLOAT),
            helper.make_node("Add", ["A", "B"], ["SUM"]),
            helper.make_node("Cast", ["SUM"], ["OUTPUT1"], to=TensorProto.BFLOAT16),
        ]
    else:
        nodes.append(helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT1"]))
    return graph_model(nodes, inputs, outputs, f"dt_{datatype.lower()}")


def make_datatype_repository(root: Path, datatypes: list[str] | None = None) -> Path:
    """``dt_<type>`` for each datatype (config inputs/outputs read from the file)."""
    for datatype in datatypes or list(ONNX_TYPES):
        model_dir = root / f"dt_{datatype.lower()}"
        (model_dir / "1").mkdir(parents=True, exist_ok=True)
        onnx.save(datatype_model(datatype), str(model_dir / "1" / "model.onnx"))
        (model_dir / "config.pbtxt").write_text(
            'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
            "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
        )
    return root


class _PassThrough(torch.nn.Module):
    """TorchScript's pair: OUTPUT__0 = INPUT__0, OUTPUT__1 = INPUT__1 (torch has no
    arithmetic kernels for uint16/32/64, so the check is the dtype plumbing itself)."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return a, b


def make_torchscript_datatype_repository(root: Path, datatypes: list[str] | None = None) -> Path:
    """``ts_<type>`` for each datatype: a pytorch_libtorch model, tensors from the config."""
    for datatype in datatypes or list(ONNX_TYPES):
        model_dir = root / f"ts_{datatype.lower()}"
        (model_dir / "1").mkdir(parents=True, exist_ok=True)
        torch.jit.script(_PassThrough()).save(str(model_dir / "1" / "model.pt"))
        tensors = "\n".join(
            f'{kind} [ {{ name: "{kind.upper()}__{i}" data_type: TYPE_{datatype} dims: [ {WIDTH} ] }} ]'
            for kind in ("input", "output")
            for i in (0, 1)
        )
        (model_dir / "config.pbtxt").write_text(
            'platform: "pytorch_libtorch"\nmax_batch_size: 8\n'
            f"{tensors}\ninstance_group [ {{ count: 1 kind: KIND_CPU }} ]\n"
        )
    return root
