"""CPU time per identity request through the whole app, in-process (no sockets, no client).

``time.process_time`` counts this process's CPU only (all its threads), so other programs on a
shared machine disturb it far less than wall-clock throughput: a way to compare two trees'
hot paths (e.g. main vs a branch) side by side in one run.

    python -m benchmarks.route_cpu_cost [--roots DIR_A DIR_B] [--requests 4000] [--rounds 3]

Each measurement runs in a fresh subprocess with ``PYTHONPATH`` set to one root; roots
alternate round by round. Prints a table and writes results/route_cpu_cost.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks._harness import ROOT, save

BODY = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32",
                               "data": [float(i) for i in range(16)]}]}).encode()  # fmt: skip


async def measure(requests: int, concurrency: int) -> float:
    """Microseconds of process CPU per request (identity, dynamic batcher, no delay)."""
    from wattserve.server.app import create_app
    from wattserve.server.settings import Settings

    app = create_app(Settings(model="identity", batcher="dynamic", max_batch_size=16, max_queue_delay_ms=0,
                              telemetry=False))  # fmt: skip

    async def one() -> int:
        sent = False
        status = 0

        async def receive() -> dict:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": BODY, "more_body": False}
            await asyncio.sleep(3600)  # never disconnects
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]

        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                 "scheme": "http", "path": "/v2/models/identity/infer", "raw_path": b"/v2/models/identity/infer",
                 "query_string": b"", "root_path": "", "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 1),
                 "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())],
                 "app": app}  # fmt: skip
        await app(scope, receive, send)
        return status

    async def worker(n: int) -> None:
        for _ in range(n):
            assert await one() == 200

    async with app.router.lifespan_context(app):
        await asyncio.gather(*(worker(50) for _ in range(concurrency)))  # warm-up
        start = time.process_time()
        await asyncio.gather(*(worker(requests // concurrency) for _ in range(concurrency)))
        spent = time.process_time() - start
    return spent / (requests // concurrency * concurrency) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--roots", nargs="+", type=Path, default=[ROOT])
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(asyncio.run(measure(args.requests, args.concurrency)))
        return
    runs: dict[str, list[float]] = {str(r): [] for r in args.roots}
    for _ in range(args.rounds):
        for root in args.roots:
            env = {**os.environ, "PYTHONPATH": str(root)}
            out = subprocess.run([sys.executable, "-m", "benchmarks.route_cpu_cost", "--child",
                                  "--requests", str(args.requests), "--concurrency", str(args.concurrency)],
                                 cwd=root, env=env, capture_output=True, text=True, check=True)  # fmt: skip
            runs[str(root)].append(float(out.stdout.strip().splitlines()[-1]))
    print(f"{'tree':<50} {'CPU us/request (median)':>24}  per round")
    for root, values in runs.items():
        print(f"{root:<50} {statistics.median(values):>24.1f}  {', '.join(f'{v:.1f}' for v in values)}")
    path = save("route_cpu_cost", {"runs": runs, "requests": args.requests, "concurrency": args.concurrency})
    print(f"saved {path}")


if __name__ == "__main__":
    main()
