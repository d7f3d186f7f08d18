"""Stateful models in a Triton repository layout, the shape of Triton's QA sequence models:
an accumulator that gets INPUT and the START, READY and CORRID control tensors and answers
the running sum of its sequence's inputs.

- ``onnx_accumulator``: ONNX (built with onnx.helper), its running sum kept as implicit state
  (``state { input_name: "SUM_IN" output_name: "SUM_OUT" }``); CORRID comes back as
  CORRID_OUT, so a test sees the server filled it. Direct by default, or any strategy.
- ``python_accumulator``: a Python model that keeps a sum per ``request.correlation_id()``,
  answers the request flags and the CORRID tensor it was given, and fails a request whose
  sequence has another request in the same ``execute`` (they must never run together).
"""

from __future__ import annotations

from pathlib import Path

import torch
from onnx import TensorProto, helper, save

from support.onnx_models import graph_model

CONTROLS = """  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: {corrid_type} }} ] }}
  ]"""

ONNX_CONFIG = """platform: "onnxruntime_onnx"
max_batch_size: 4
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }},
         {{ name: "CORRID_OUT" data_type: TYPE_UINT64 dims: [ 1 ] }} ]
sequence_batching {{
  max_sequence_idle_microseconds: {idle_us}
  {strategy}
{controls}
  state [ {{ input_name: "SUM_IN" output_name: "SUM_OUT" data_type: TYPE_INT32 dims: [ 1 ]
             initial_state {{ data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "zeros" }} }} ]
}}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""

PYTHON_CONFIG = """backend: "python"
max_batch_size: 4
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }},
         {{ name: "FLAGS" data_type: TYPE_INT32 dims: [ 1 ] }},
         {{ name: "START_SEEN" data_type: TYPE_INT32 dims: [ 1 ] }},
         {{ name: "CORRID_SEEN" data_type: TYPE_STRING dims: [ 1 ] }} ]
sequence_batching {{
  max_sequence_idle_microseconds: {idle_us}
  direct {{ max_queue_delay_microseconds: {delay_us} }}
{controls}
}}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""

PYTHON_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils

START = pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        ids = [request.correlation_id() for request in requests]
        responses = []
        for request, cid in zip(requests, ids):
            if ids.count(cid) > 1:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    f"sequence {cid} has {ids.count(cid)} requests in one execute")))
                continue
            value = int(pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()[0, 0])
            start = int(pb_utils.get_input_tensor_by_name(request, "START").as_numpy()[0, 0])
            ready = int(pb_utils.get_input_tensor_by_name(request, "READY").as_numpy()[0, 0])
            corrid = pb_utils.get_input_tensor_by_name(request, "CORRID").as_numpy()[0, 0]
            corrid = corrid if isinstance(corrid, bytes) else str(corrid).encode()
            if request.flags() & START:
                self.sums[cid] = 0
            total = self.sums.get(cid, 0) + value * ready
            self.sums[cid] = (total + 2**31) % 2**32 - 2**31  # int32 arithmetic, as the ONNX model's
            out = [
                pb_utils.Tensor("OUTPUT", np.array([[self.sums[cid]]], np.int32)),
                pb_utils.Tensor("FLAGS", np.array([[request.flags()]], np.int32)),
                pb_utils.Tensor("START_SEEN", np.array([[start]], np.int32)),
                pb_utils.Tensor("CORRID_SEEN", np.array([[corrid]], dtype=object)),
            ]
            responses.append(pb_utils.InferenceResponse(out))
        return responses
"""


def accumulator_graph():
    """OUTPUT = SUM_OUT = SUM_IN + (READY ? INPUT : 0); CORRID_OUT = CORRID. START is an input
    the graph does not read: on START the server feeds the initial state (Triton's implicit
    state), so the sum starts over there."""

    def tensor(name: str, kind: int):
        return helper.make_tensor_value_info(name, kind, ["batch", 1])

    int32 = TensorProto.INT32
    nodes = [
        helper.make_node("Mul", ["INPUT", "READY"], ["added"]),
        helper.make_node("Add", ["SUM_IN", "added"], ["SUM_OUT"]),
        helper.make_node("Identity", ["SUM_OUT"], ["OUTPUT"]),
        helper.make_node("Identity", ["CORRID"], ["CORRID_OUT"]),
    ]
    inputs = [tensor(n, int32) for n in ("INPUT", "START", "READY", "SUM_IN")]
    inputs.append(tensor("CORRID", TensorProto.UINT64))
    outputs = [tensor("OUTPUT", int32), tensor("SUM_OUT", int32), tensor("CORRID_OUT", TensorProto.UINT64)]
    return graph_model(nodes, inputs, outputs, "accumulator")


def onnx_accumulator(
    root: Path, name: str = "acc_onnx", idle_us: int = 5_000_000, delay_us: int = 0, strategy: str = ""
) -> Path:
    """``strategy``: the config's strategy (default: direct with ``delay_us``)."""
    folder = Path(root) / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    controls = CONTROLS.format(corrid_type="TYPE_UINT64")
    strategy = strategy or f"direct {{ max_queue_delay_microseconds: {delay_us} }}"
    text = ONNX_CONFIG.format(idle_us=idle_us, strategy=strategy, controls=controls)
    (folder / "config.pbtxt").write_text(text)
    save(accumulator_graph(), str(folder / "1" / "model.onnx"))
    return folder


TORCHSCRIPT_CONFIG = """platform: "pytorch_libtorch"
max_batch_size: 4
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }},
         {{ name: "CORRID_OUT" data_type: TYPE_INT64 dims: [ 1 ] }} ]
sequence_batching {{
  max_sequence_idle_microseconds: {idle_us}
{controls}
  state [ {{ input_name: "SUM_IN" output_name: "SUM_OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
}}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""


class TorchAccumulator(torch.nn.Module):
    """The ONNX accumulator in TorchScript: its inputs positionally in config order (INPUT,
    then the control inputs, then the state), its outputs (OUTPUT, CORRID_OUT, then SUM_OUT)."""

    def forward(self, x, start, ready, corrid, sum_in):  # START unread: the server feeds the initial state
        total = sum_in + x * ready
        return total, corrid, total


def torchscript_accumulator(root: Path, name: str = "acc_torchscript", idle_us: int = 5_000_000) -> Path:
    folder = Path(root) / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    controls = CONTROLS.format(corrid_type="TYPE_INT64")
    (folder / "config.pbtxt").write_text(TORCHSCRIPT_CONFIG.format(idle_us=idle_us, controls=controls))
    torch.jit.script(TorchAccumulator()).save(str(folder / "1" / "model.pt"))
    return folder


ENSEMBLE_CONFIG = """platform: "ensemble"
max_batch_size: 4
input [ {{ name: "VALUE" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "SUM" data_type: TYPE_INT32 dims: [ 1 ] }} ]
ensemble_scheduling {{ step [ {{ model_name: "{step}" model_version: -1
  input_map {{ key: "INPUT" value: "VALUE" }} output_map {{ key: "OUTPUT" value: "SUM" }} }} ] }}
"""


def ensemble_over(root: Path, step: str, name: str = "acc_ensemble") -> Path:
    """An ensemble whose one step is the stateful model ``step``: the step gets the
    ensemble request's correlation ID and flags."""
    folder = Path(root) / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    (folder / "config.pbtxt").write_text(ENSEMBLE_CONFIG.format(step=step))
    return folder


def python_accumulator(
    root: Path, name: str = "acc_python", idle_us: int = 5_000_000, delay_us: int = 0,
    corrid_type: str = "TYPE_STRING",
) -> Path:  # fmt: skip
    folder = Path(root) / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    controls = CONTROLS.format(corrid_type=corrid_type)
    (folder / "config.pbtxt").write_text(
        PYTHON_CONFIG.format(idle_us=idle_us, delay_us=delay_us, controls=controls)
    )
    (folder / "1" / "model.py").write_text(PYTHON_MODEL)
    return folder
