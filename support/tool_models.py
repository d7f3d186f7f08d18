"""A small Triton-layout repository for NVIDIA's tools (perf_analyzer, Model Analyzer).

Four models, each the smallest that exercises one thing those tools send:

- ``identity``: wattserve's built-in identity, FP32 ``[16]``, batching: the plain case.
- ``add``: ONNX ``Add(INPUT0, INPUT0)``, FP32 ``[16]``: an ONNX Runtime model with fixed dims
  (the one Model Analyzer profiles).
- ``add_var``: ONNX ``Add(INPUT0, INPUT0)``, FP32 ``dims: [ -1 ]`` (a variable dimension;
  perf_analyzer needs ``--shape INPUT0:16``).
- ``string_identity``: ONNX ``Identity``, ``TYPE_STRING`` (BYTES) ``dims: [ 4 ]``.

ONNX Runtime's Python API takes string tensors only as numpy object arrays of ``str``
(UTF-8 text): an object array of ``bytes`` is converted element by element with ``str()``
(``b'a'`` becomes the four characters ``"b'a'"``, silently), a fixed-width ``S`` array is cut
at the first NUL byte, and outputs always come back as ``str``. So a server must decode BYTES
elements as UTF-8 before ONNX Runtime and encode them after, and refuse non-UTF-8 bytes for
an ONNX string input (they cannot reach the model unchanged).

``python -m support.tool_models DIR`` writes the repository (scripts use it).
"""

from __future__ import annotations

import sys
from pathlib import Path

import onnx
from onnx import TensorProto, helper

from support.onnx_models import graph_model

IDENTITY_CONFIG = """
backend: "wattserve"
max_batch_size: 16
dynamic_batching { }
parameters { key: "builtin" value: { string_value: "identity" } }
parameters { key: "identity_elements" value: { string_value: "16" } }
"""

ADD_CONFIG = """
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
dynamic_batching { }
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

ADD_VAR_CONFIG = """
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
dynamic_batching { }
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

STRING_IDENTITY_CONFIG = """
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ 4 ] } ]
dynamic_batching { }
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


def one_node_model(op: str, inputs: list[str], elem_type: int, shape: list[str | int]) -> onnx.ModelProto:
    """A graph of one ``op`` from INPUT0 to OUTPUT0, both ``elem_type`` of ``shape``."""
    model = graph_model(
        [helper.make_node(op, inputs, ["OUTPUT0"])],
        [helper.make_tensor_value_info("INPUT0", elem_type, shape)],
        [helper.make_tensor_value_info("OUTPUT0", elem_type, shape)],
        op.lower(),
    )
    onnx.checker.check_model(model)
    return model


def write_model(root: Path, name: str, config: str, model: onnx.ModelProto | None = None) -> None:
    (root / name).mkdir(parents=True, exist_ok=True)
    (root / name / "config.pbtxt").write_text(config)
    if model is not None:
        (root / name / "1").mkdir(exist_ok=True)
        onnx.save(model, str(root / name / "1" / "model.onnx"))


def make_tool_repository(root: Path) -> Path:
    """Write identity, add, add_var and string_identity under ``root``; return ``root``."""
    write_model(root, "identity", IDENTITY_CONFIG)
    write_model(
        root, "add", ADD_CONFIG, one_node_model("Add", ["INPUT0", "INPUT0"], TensorProto.FLOAT, ["b", 16])
    )
    write_model(
        root,
        "add_var",
        ADD_VAR_CONFIG,
        one_node_model("Add", ["INPUT0", "INPUT0"], TensorProto.FLOAT, ["b", "n"]),
    )
    write_model(
        root,
        "string_identity",
        STRING_IDENTITY_CONFIG,
        one_node_model("Identity", ["INPUT0"], TensorProto.STRING, ["b", 4]),
    )
    return root


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m support.tool_models DIR")
    print(make_tool_repository(Path(sys.argv[1])))
