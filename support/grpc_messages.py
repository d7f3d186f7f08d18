"""gRPC ModelInfer messages with typed BYTES contents, built raw, and what decoding one
costs in memory: the hostile-size cases the gRPC front end must refuse or bound
(``server/grpc/wire.py``), shared by its tests and by ``benchmarks.grpc_memory`` and
``benchmarks.bytes_decode_cost``, which measure them."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from tritonclient.grpc import service_pb2

ROOT = Path(__file__).resolve().parent.parent
METHOD = "/inference.GRPCInferenceService/ModelInfer"  # the raw method path, for unparsed calls


def big_request(model: str, elements: int, element_bytes: int) -> bytes:
    """The serialized message: one BYTES input of ``elements`` typed elements."""
    request = service_pb2.ModelInferRequest(model_name=model)
    tensor = request.inputs.add(name="INPUT0", datatype="BYTES", shape=[elements])
    tensor.contents.bytes_contents.extend([b"x" * element_bytes] * elements)
    return request.SerializeToString()


def request_bytes(elements: int, length: int) -> tuple[bytes, int]:
    """The serialized message and the wire bytes of its typed contents alone."""
    request = service_pb2.ModelInferRequest(model_name="m")
    tensor = request.inputs.add(name="INPUT0", datatype="BYTES", shape=[elements])
    tensor.contents.bytes_contents.extend([b"x" * length] * elements)
    return request.SerializeToString(), tensor.contents.ByteSize()


# Linux: writing 5 to clear_refs resets the process's peak RSS (VmHWM), so the peak read
# after decoding is that of the decoding alone, not of reading the file.
_CHILD = """
import gc, sys
from tritonclient.grpc import service_pb2
from wattserve.server.core.bytes_tensors import bytes_from_values
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
raw = open(sys.argv[1], "rb").read()
n = int(sys.argv[2])
gc.collect()
open("/proc/self/clear_refs", "w").write("5")
before = status("VmRSS:")
message = service_pb2.ModelInferRequest.FromString(raw)
array = bytes_from_values(message.inputs[0].contents.bytes_contents, "INPUT0", [n])
print(status("VmHWM:") - before, status("VmRSS:") - before)
"""


def decode_cost(elements: int, length: int) -> dict[str, float]:
    """Peak RSS of what the gRPC front end does with one message of ``elements`` BYTES
    elements of ``length`` bytes (protobuf's parse, then the engine's object array),
    measured in a fresh process above what it held before parsing."""
    raw, contents = request_bytes(elements, length)
    with tempfile.NamedTemporaryFile(suffix=".bin") as f:
        f.write(raw)
        f.flush()
        del raw
        out = subprocess.run([sys.executable, "-c", _CHILD, f.name, str(elements)], capture_output=True,
                             text=True, check=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT)})  # fmt: skip
    peak, held = (int(v) for v in out.stdout.split())
    return {
        "length": length,
        "elements": elements,
        "contents_wire_bytes": contents,
        "peak_bytes": peak,
        "held_after_bytes": held,
        "per_wire_byte": peak / contents,
        "per_element": peak / elements,
    }
