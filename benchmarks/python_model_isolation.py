"""Does a busy Python model (Triton's Python backend) stall the event loop and the other
models, with its instances on engine threads in the server's process or in worker processes?

One server per isolation mode (``python_model_isolation`` thread and process, both up at
once, their rounds interleaved so both see the same machine), one repository: a built-in identity (the fast path) and two Python models that take
``--busy-ms`` per execute call, one spinning in pure Python (holds the GIL but for the
interpreter's switch interval) and one sleeping (releases it: the same occupancy without
the GIL, the control). identity latency (wrk, closed loop, 2 connections) is measured
alone, then while each Python model is kept saturated by a second wrk (4 connections); a
light Python model (add_sub) alone shows what the hop to a worker process costs a request.
What is left beside the busy model is CPU sharing and, for the spinning one in thread mode,
the GIL; in process mode the spinning model's GIL is its own process's.

    python -m benchmarks.python_model_isolation [--seconds 8] [--rounds 2] [--busy-ms 50]
                                                [--isolation thread,process]

Prints a table per mode and writes results/python_model_isolation.json. Needs wrk.
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import statistics
import sys
import tempfile
import threading
from pathlib import Path

import orjson

from benchmarks._harness import save, wattserve, wrk
from support.python_models import write_python_model

IDENTITY = """backend: "wattserve"
max_batch_size: 16
dynamic_batching { max_queue_delay_microseconds: 0 }
parameters { key: "builtin" value: { string_value: "identity" } }
"""
IDENTITY_BODY = orjson.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32",
                                          "data": [float(i) for i in range(16)]}]})  # fmt: skip
BUSY_BODY = orjson.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32",
                                      "data": [1.0, 2.0, 3.0, 4.0]}]})  # fmt: skip


PYTHON_BODY = orjson.dumps({"inputs": [{"name": n, "shape": [4], "datatype": "FP32", "data": [1.0, 2.0, 3.0, 4.0]}
                                       for n in ("INPUT0", "INPUT1")]})  # fmt: skip
KEYS = ("identity_alone", "python_add_sub_alone", "identity_beside_busy_cpu", "busy_cpu",
        "identity_beside_busy_sleep", "busy_sleep")  # fmt: skip


def measure_round(url: str, seconds: float, runs: dict[str, list[dict]]) -> None:
    """One round on the server at ``url``, appended to ``runs``."""
    ident = url + "/v2/models/identity/infer"
    runs["identity_alone"].append(wrk(ident, IDENTITY_BODY, 2, seconds))
    # a light Python model alone: what the hop to its process costs a request
    runs["python_add_sub_alone"].append(wrk(f"{url}/v2/models/add_sub/infer", PYTHON_BODY, 2, seconds))
    for model, key in (("busy", "cpu"), ("sleepy", "sleep")):
        box: list[dict] = []

        def saturate(out: list[dict] = box, model: str = model) -> None:
            out.append(wrk(f"{url}/v2/models/{model}/infer", BUSY_BODY, 4, seconds + 3))

        thread = threading.Thread(target=saturate, daemon=True)
        thread.start()
        threading.Event().wait(1.5)  # the busy model's queue fills first
        runs[f"identity_beside_busy_{key}"].append(wrk(ident, IDENTITY_BODY, 2, seconds))
        thread.join()
        runs[f"busy_{key}"].append(box[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--busy-ms", type=float, default=50)
    parser.add_argument("--isolation", default="thread,process",
                        help="the modes to measure, in each round in this order (comma separated)")  # fmt: skip
    parser.add_argument("--switch-interval-ms", type=float, default=None,
                        help="the busy model's initialize sets sys.setswitchinterval (process-wide)")  # fmt: skip
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        (repo / "identity").mkdir()
        (repo / "identity" / "config.pbtxt").write_text(IDENTITY)
        busy = write_python_model(repo, "busy", busy_ms=args.busy_ms)
        if args.switch_interval_ms is not None:  # a model may shorten the GIL's hand-over itself
            source = busy / "1" / "model.py"
            source.write_text(source.read_text().replace(
                "class TritonPythonModel:\n",
                "class TritonPythonModel:\n    def initialize(self, args):\n        import sys\n"
                f"        sys.setswitchinterval({args.switch_interval_ms / 1e3})\n\n",
            ))  # fmt: skip
        write_python_model(repo, "sleepy", busy_ms=args.busy_ms)
        write_python_model(repo, "add_sub")
        modes = [m.strip() for m in args.isolation.split(",") if m.strip()]
        by_mode: dict[str, dict[str, list[dict]]] = {mode: {k: [] for k in KEYS} for mode in modes}
        with contextlib.ExitStack() as servers:  # every mode's server up at once: rounds interleave
            urls = {}
            for mode in modes:
                env = {"WATTSERVE_MODEL_REPOSITORY": str(repo), "WATTSERVE_TELEMETRY": "false",
                       "WATTSERVE_PYTHON_MODEL_ISOLATION": mode}  # fmt: skip
                urls[mode] = servers.enter_context(wattserve(env))
                wrk(urls[mode] + "/v2/models/identity/infer", IDENTITY_BODY, 2, 2)  # warm-up
            for _ in range(args.rounds):
                for mode in modes:
                    measure_round(urls[mode], args.seconds, by_mode[mode])

    interval = (
        args.switch_interval_ms if args.switch_interval_ms is not None else sys.getswitchinterval() * 1e3
    )
    print(f"busy model: {args.busy_ms:g} ms per execute; switch interval {interval:g} ms")
    print("median over rounds (a p99's mean is one bad round's); every round in the JSON")
    for mode, runs in by_mode.items():

        def median(name: str, key: str, runs: dict[str, list[dict]] = runs) -> float:
            return statistics.median(r[key] for r in runs[name])

        print(f"\n{mode:<30} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>8}   p99 per round")
        for name in runs:
            rounds = " ".join(f"{r['p99_ms']:.1f}" for r in runs[name])
            print(
                f"{name:<30} {median(name, 'p50_ms'):>8.2f} {median(name, 'p99_ms'):>8.2f} "
                f"{median(name, 'rps'):>8.0f}   {rounds}"
            )
        beside, alone = median("identity_beside_busy_cpu", "p99_ms"), median("identity_alone", "p99_ms")
        print(f"identity p99 beside the spinning model / alone: {beside / alone:.2f}x")
    errors = sum(r["non_2xx"] for runs in by_mode.values() for v in runs.values() for r in v)
    suffix = "" if args.switch_interval_ms is None else f"_switch{args.switch_interval_ms:g}ms"
    doc = {"runs_by_isolation": by_mode, "busy_ms": args.busy_ms, "switch_interval_ms": interval,
           "seconds": args.seconds, "rounds": args.rounds, "non_2xx": errors,
           "machine": platform.platform()}  # fmt: skip
    path = save(f"python_model_isolation{suffix}", doc)
    print(f"non-2xx answers: {errors}\nsaved {path}")


if __name__ == "__main__":
    main()
