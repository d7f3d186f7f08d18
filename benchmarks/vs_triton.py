"""wattserve vs Triton, side by side: the same model, the same batching knobs, the same client.

    python -m benchmarks.vs_triton --triton-python /work/.venv-triton/bin/python [--quick]

Triton runs through PyTriton in its own virtualenv (not a wattserve dependency). Build it once:

    scripts/triton_venv.sh /work/.venv-triton
    # = python3 -m venv /work/.venv-triton && /work/.venv-triton/bin/pip install \\
    #     torch==2.14.1 torchvision==0.29.1 nvidia-pytriton==0.7.0 numpy

What runs: wattserve (``python -m wattserve serve``, dynamic batcher) and Triton
(support/triton_mobilenet.py, Triton's dynamic batcher) serve the same model built by
wattserve's own ``engines.torch_engine`` (same seed, BatchNorm calibration, channels_last,
torch threads), with the same max batch (8), max queue delay (5 ms) and one instance. Both are
up for the whole run; the project's open-loop Poisson generator (loadgen) drives one at a
time with KServe v2 binary tensors:

1. capacity: ``loadgen.search.find_max_rate``, the highest rate whose p99 (failed requests
   counted as infinitely slow) is within the objective (default p99 <= 200 ms), for each;
2. fixed rates: 25/50/75/100% of each server's capacity, both servers at every rate, the same
   arrival schedule for both, the order alternating from rate to rate so drift hits both.

Prints the tables (markdown) and saves results/vs_triton.json with every step, the load
average before/after each run and the versions. ``--quick``: short windows, coarse search.
The measurement itself (knobs, windows, search, tables) is ``support/triton_pair.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import os
import platform
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from benchmarks._harness import ROOT, free_port, process, save, wattserve
from support.triton_pair import (
    FULL,
    QUICK,
    TRITON,
    WATTSERVE,
    ServingKnobs,
    default_knobs,
    format_tables,
    loadavg,
    measure,
    parse_args,
)

TRITON_SCRIPT = "support/triton_mobilenet.py"

# --------------------------------------------------------------------------------------------
# Running it


def triton_library_path(triton_python: str) -> str:
    """<that interpreter's sys.base_prefix>/lib: the Python backend stub needs it (RLock error)."""
    base = subprocess.run(
        [triton_python, "-c", "import sys; print(sys.base_prefix)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return str(Path(base) / "lib")


def triton_versions(triton_python: str) -> dict[str, str]:
    code = (
        "import importlib.metadata as m, json; "
        "print(json.dumps({p: m.version(p) for p in ('nvidia-pytriton', 'torch', 'torchvision')}))"
    )
    out = subprocess.run([triton_python, "-c", code], capture_output=True, text=True, check=True).stdout
    import json

    return json.loads(out)


@contextlib.contextmanager
def triton(knobs: ServingKnobs, triton_python: str) -> Iterator[tuple[str, str]]:
    """Triton (via PyTriton) on free loopback ports; yields (base url, metrics url)."""
    http, grpc, metrics = free_port(), free_port(), free_port()
    libdir = triton_library_path(triton_python)
    env = {"LD_LIBRARY_PATH": os.pathsep.join(filter(None, [libdir, os.environ.get("LD_LIBRARY_PATH")]))}
    url = f"http://127.0.0.1:{http}"
    cmd = [triton_python, str(ROOT / TRITON_SCRIPT), *knobs.triton_args(http, grpc, metrics)]
    with process(cmd, env, f"{url}/v2/models/{knobs.model}/ready", timeout=600):
        yield url, f"http://127.0.0.1:{metrics}/metrics"


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv, __doc__)
    if not Path(args.triton_python).exists():
        raise SystemExit(f"{args.triton_python} not found; build the Triton venv with scripts/triton_venv.sh")
    win = QUICK if args.quick else FULL
    if args.search_queries:
        win = dataclasses.replace(win, search_queries=args.search_queries)
    if args.point_queries:
        win = dataclasses.replace(win, point_queries=args.point_queries)
    knobs = default_knobs(args.model, args.torch_threads)
    from wattserve.loadgen.runner import run_async

    started = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    la_start = loadavg()
    print(
        f"load average at start: {la_start} on {os.cpu_count()} CPUs (a shared machine: compare ratios only)"
    )
    with wattserve(knobs.wattserve_env()) as w_url, triton(knobs, args.triton_python) as (t_url, t_metrics):
        doc = run_async(measure(args, win, {WATTSERVE: w_url, TRITON: t_url}, t_metrics))
    doc |= {
        "command": " ".join(
            ["python -m benchmarks.vs_triton", *(argv if argv is not None else sys.argv[1:])]
        ),
        "started_at": started,
        "finished_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "loadavg_start": la_start,
        "loadavg_end": loadavg(),
        "cpus": os.cpu_count(),
        "machine": platform.platform(),
        "knobs": dataclasses.asdict(knobs),
        "windows": dataclasses.asdict(win),
        "triton_versions": triton_versions(args.triton_python),
        "git": _git_describe(),
    }
    print()
    print(format_tables(doc))
    print(f"\nload average: start {la_start}, end {doc['loadavg_end']} ({os.cpu_count()} CPUs)")
    print(f"saved {save(args.out, doc)}")


def _git_describe() -> str | None:
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        return subprocess.run(
            ["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    return None


if __name__ == "__main__":
    main()
