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
gives the per-unit costs ``server/grpc/wire.py`` reserves (the measurement:
``support/grpc_messages.decode_cost``, which tests/test_grpc_decode_estimate.py checks the estimate against). The rows are saved to
``results/bytes_decode_cost.json``.
"""

from __future__ import annotations

import argparse

import numpy as np

from benchmarks._harness import save
from support.grpc_messages import decode_cost

MIB = 1024 * 1024


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
    rows = [decode_cost(args.elements, int(length)) for length in args.lengths.split(",")]
    print(f"{'L':>4} {'wire MiB':>9} {'peak MiB':>9} {'/wire B':>8} {'/element':>9}")
    for r in rows:
        print(f"{r['length']:>4} {r['contents_wire_bytes'] / MIB:>9.1f} {r['peak_bytes'] / MIB:>9.1f} "
              f"{r['per_wire_byte']:>8.2f} {r['per_element']:>9.1f}")  # fmt: skip
    a, b, c = fit(rows)
    print(f"fit: peak = {a:.2f} * wire + {b:.1f} * elements + {c:.1f} * objects (elements > 1 byte)")
    save("bytes_decode_cost", {"rows": rows, "fit": {"a": a, "b": b, "c": c}})


if __name__ == "__main__":
    main()
