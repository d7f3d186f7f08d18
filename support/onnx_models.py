"""Tiny ONNX models in a Triton repository layout, built with onnx.helper in milliseconds:
the shapes Triton's own QA generators make (identity and add/sub over any datatype, fixed
or variable dimensions), for conformance tests and benchmarks. Nothing is downloaded.

``graph_model`` is the one place that turns nodes into a ModelProto the installed ONNX
Runtime reads (opset, IR version); the other test-model builders in support/ and tests/ use
it, and ``ONNX_TYPES`` is the one Triton datatype -> ONNX element type table."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from onnx import ModelProto, TensorProto, checker, helper, numpy_helper, save

ONNX_TYPES = {
    "BOOL": TensorProto.BOOL,
    "UINT8": TensorProto.UINT8,
    "UINT16": TensorProto.UINT16,
    "UINT32": TensorProto.UINT32,
    "UINT64": TensorProto.UINT64,
    "INT8": TensorProto.INT8,
    "INT16": TensorProto.INT16,
    "INT32": TensorProto.INT32,
    "INT64": TensorProto.INT64,
    "FP16": TensorProto.FLOAT16,
    "FP32": TensorProto.FLOAT,
    "FP64": TensorProto.DOUBLE,
    "BF16": TensorProto.BFLOAT16,
    "BYTES": TensorProto.STRING,
}


def _dims(dims: list[int], batched: bool) -> list[int | str | None]:
    out: list[int | str | None] = ["batch"] if batched else []
    out += [None if d == -1 else d for d in dims]
    return out


def graph_model(
    nodes: list, inputs: list, outputs: list, name: str, initializer: list | None = None
) -> ModelProto:
    """One graph as a model every ONNX Runtime the project supports reads (opset 17, IR 8)."""
    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=initializer or [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _save(nodes, inputs, outputs, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    save(graph_model(nodes, inputs, outputs, path.parent.parent.name), str(path))


def config_type(datatype: str) -> str:
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


def _elementwise_model(
    root: Path, name: str, datatype: str, dims: list[int], max_batch_size: int, extra_config: str,
    nodes: list, inputs: list[str], outputs: list[str],
) -> Path:  # fmt: skip
    """One ONNX graph of same-shaped tensors and its config.pbtxt (one CPU instance)."""
    t = ONNX_TYPES[datatype]
    shape = _dims(dims, max_batch_size > 0)
    _save(
        nodes,
        [helper.make_tensor_value_info(n, t, shape) for n in inputs],
        [helper.make_tensor_value_info(n, t, shape) for n in outputs],
        root / name / "1" / "model.onnx",
    )
    tensor = f"data_type: {config_type(datatype)} dims: [ {', '.join(map(str, dims))} ]"
    listed = {what: ", ".join(f'{{ name: "{n}" {tensor} }}' for n in names)
              for what, names in (("input", inputs), ("output", outputs))}  # fmt: skip
    (root / name / "config.pbtxt").write_text(
        f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: {max_batch_size}\n'
        f"input [ {listed['input']} ]\noutput [ {listed['output']} ]\n"
        f"instance_group [ {{ count: 1 kind: KIND_CPU }} ]\n{extra_config}"
    )
    return root / name


def identity_model(root: Path, name: str, datatype: str, dims: list[int], max_batch_size: int,
                   extra_config: str = "") -> Path:  # fmt: skip
    """INPUT0 -> OUTPUT0 unchanged (Triton's ``*_identity`` QA models), with config.pbtxt."""
    nodes = [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])]
    return _elementwise_model(root, name, datatype, dims, max_batch_size, extra_config, nodes,
                              ["INPUT0"], ["OUTPUT0"])  # fmt: skip


def add_sub_model(root: Path, name: str, datatype: str, dims: list[int], max_batch_size: int,
                  extra_config: str = "") -> Path:  # fmt: skip
    """OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 (Triton's QA "simple" models)."""
    nodes = [
        helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
        helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
    ]
    return _elementwise_model(root, name, datatype, dims, max_batch_size, extra_config, nodes,
                              ["INPUT0", "INPUT1"], ["OUTPUT0", "OUTPUT1"])  # fmt: skip


def scalar_identity_model(root: Path, name: str, config_dims: list[int]) -> Path:
    """A model whose tensors are scalars (shape []), its config declaring ``config_dims``
    (Triton's qa/common/gen_qa_ort_scalar_models.py: dims [1] or [1, 1] for a scalar)."""
    _save(
        [helper.make_node("Identity", ["INPUT"], ["OUTPUT"])],
        [helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, [])],
        [helper.make_tensor_value_info("OUTPUT", TensorProto.FLOAT, [])],
        root / name / "1" / "model.onnx",
    )
    dims = ", ".join(map(str, config_dims))
    (root / name / "config.pbtxt").write_text(
        f'platform: "onnxruntime_onnx"\ninput [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [ {dims} ] }} ]\n'
        f'output [ {{ name: "OUTPUT" data_type: TYPE_FP32 dims: [ {dims} ] }} ]\n'
        "instance_group [ { kind: KIND_CPU } ]\n"
    )
    return root / name


ADD_DEFAULT_B = 10.0  # optional_add_model's B when a request leaves it out


def optional_add_model(required_b: bool = False) -> bytes:
    """Y = A + B, B an optional input defaulting to ``ADD_ADD_DEFAULT_B`` (an initializer of the
    input's name), unless ``required_b``: Triton's optional inputs on ONNX Runtime."""
    a = helper.make_tensor_value_info("A", TensorProto.FLOAT, ["N", 4])
    b = helper.make_tensor_value_info("B", TensorProto.FLOAT, ["M", 4])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 4])
    defaults = (
        [] if required_b else [numpy_helper.from_array(np.full((1, 4), ADD_DEFAULT_B, np.float32), "B")]
    )
    graph = helper.make_graph([helper.make_node("Add", ["A", "B"], ["Y"])], "add", [a, b], [y], defaults)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    checker.check_model(model)
    return model.SerializeToString()
