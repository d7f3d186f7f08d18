"""What decoding gRPC ``bytes_contents`` costs in memory, per wire byte and per element.

    python -m benchmarks.bytes_decode_cost [--elements 2000000] [--lengths 0,1,2,4,8,16,64]

For each element length L: one ModelInferRequest with ``--elements`` BYTES elements of L
bytes in ``bytes_contents`` is serialized here; a fresh child process reads it, then does
what the gRPC front end does with it (``ModelInferRequest.FromString``, then
``server.core.bytes_tensors.bytes_from_values`` into the object array the engine gets) and
reports its peak RSS (VmHWM, reset first) above what it held before parsing (the wire bytes
themselves, which ``RequestPeek.decode_cost`` counts apart). A least-squares fit of
``peak = a * contents_wire_bytes + b * elements + c * objects`` (objects: elements longer
than 1 byte, which CPython cannot share: ``b""`` and 1-byte values are cached singletons)
gives the per-unit costs ``server/grpc/wire.py`` reserves. The rows are saved to
``results/bytes_decode_cost.json``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile

import numpy as np
from tritonclient.grpc import service_pb2

from benchmarks._harness import ROOT, save

MIB = 1024 * 1024

# Linux: writing 5 to clear_refs resets the process's peak RSS (VmHWM), so the peak read
# after decoding is that of the decoding alone, not of reading the file.
CHILD = """
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


def request_bytes(elements: int, length: int) -> tuple[bytes, int]:
    """The serialized message and the wire bytes of its typed contents alone."""
    request = service_pb2.ModelInferRequest(model_name="m")
    tensor = request.inputs.add(name="INPUT0", datatype="BYTES", shape=[elements])
    tensor.contents.bytes_contents.extend([b"x" * length] * elements)
    return request.SerializeToString(), tensor.contents.ByteSize()


def measure(elements: int, length: int) -> dict[str, float]:
    raw, contents = request_bytes(elements, length)
    with tempfile.NamedTemporaryFile(suffix=".bin") as f:
        f.write(raw)
        f.flush()
        del raw
        out = subprocess.run([sys.executable, "-c", CHILD, f.name, str(elements)], capture_output=True,
                             text=True, check=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT)})  # fmt: skip
    peak, held = (int(v) for v in out.stdout.split())
    return {"length": length, "elements": elements, "contents_wire_bytes": contents, "peak_bytes": peak,
            "held_after_bytes": held, "per_wire_byte": peak / contents, "per_element": peak / elements}  # fmt: skip


def fit(rows: list[dict[str, float]]) -> tuple[float, float, float]:
    """(a, b, c) of peak = a * wire + b * elements + c * objects, least squares."""
    x = np.array([[r["contents_wire_bytes"], r["elements"], r["elements"] * (r["length"] > 1)] for r in rows])
    y = np.array([r["peak_bytes"] for r in rows])
    (a, b, c), *_ = np.linalg.lstsq(x, y, rcond=None)
    return float(a), float(b), float(c)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--elements", type=int, default=2_000_000)
    parser.add_argument("--lengths", default="0,1,2,4,8,16,64")
    args = parser.parse_args()
    rows = [measure(args.elements, int(length)) for length in args.lengths.split(",")]
    print(f"{'L':>4} {'wire MiB':>9} {'peak MiB':>9} {'/wire B':>8} {'/element':>9}")
    for r in rows:
        print(f"{r['length']:>4} {r['contents_wire_bytes'] / MIB:>9.1f} {r['peak_bytes'] / MIB:>9.1f} "
              f"{r['per_wire_byte']:>8.2f} {r['per_element']:>9.1f}")  # fmt: skip
    a, b, c = fit(rows)
    print(f"fit: peak = {a:.2f} * wire + {b:.1f} * elements + {c:.1f} * objects (elements > 1 byte)")
    save("bytes_decode_cost", {"rows": rows, "fit": {"a": a, "b": b, "c": c}})


if __name__ == "__main__":
    main()
