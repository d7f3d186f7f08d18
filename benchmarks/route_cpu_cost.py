"""CPU time per identity request through the whole app, in-process (no sockets, no client).

``time.process_time`` counts this process's CPU only (all its threads), so other programs on a
shared machine disturb it far less than wall-clock throughput: a way to compare two trees'
hot paths (e.g. main vs a branch) side by side in one run.

    python -m benchmarks.route_cpu_cost [--roots DIR_A DIR_B] [--requests 4000] [--rounds 3]
    python -m benchmarks.route_cpu_cost --opcodes [--top 30] [--roots DIR_A DIR_B]

``--opcodes`` counts Python opcodes run on the event loop's thread per request instead
(``sys.settrace``): nearly deterministic, so one round shows a change of a few percent that
the machine's drift hides from any timing. It misses C code (orjson, numpy, the socket) and
the engine thread; ``--top N`` lists the functions that run the most.

Each measurement runs in a fresh subprocess of this file with ``PYTHONPATH`` set to one
root (whose code it measures); roots alternate round by round. Prints a table and writes
results/route_cpu_cost.json (route_opcodes.json with ``--opcodes``).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks._harness import ROOT, save

BODY = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32",
                               "data": [float(i) for i in range(16)]}]}).encode()  # fmt: skip


async def measure(requests: int, concurrency: int, opcodes: bool = False) -> dict:
    """Per request (identity, dynamic batcher, no delay): microseconds of process CPU, or
    with ``opcodes`` the Python opcodes run on this thread (total and by function)."""
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

    done = requests // concurrency * concurrency
    by_function: collections.Counter[str] = collections.Counter()

    def count(frame: Any, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        if event == "opcode":
            code = frame.f_code
            by_function[f"{code.co_qualname} ({_short(code.co_filename)})"] += 1
        return count

    async with app.router.lifespan_context(app):
        await asyncio.gather(*(worker(50) for _ in range(concurrency)))  # warm-up
        start = time.process_time()
        if opcodes:
            sys.settrace(count)
        try:
            await asyncio.gather(*(worker(requests // concurrency) for _ in range(concurrency)))
        finally:
            sys.settrace(None)
        spent = time.process_time() - start
    if opcodes:
        return {"opcodes_per_request": sum(by_function.values()) / done,
                "by_function": {k: v / done for k, v in by_function.most_common()}}  # fmt: skip
    return {"cpu_us_per_request": spent / done * 1e6}


def _short(filename: str) -> str:
    return filename.split("site-packages/")[-1] if "site-packages/" in filename else Path(filename).name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--roots", nargs="+", type=Path, default=[ROOT])
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=None, help="default 3 (1 with --opcodes)")
    parser.add_argument("--opcodes", action="store_true", help="count Python opcodes instead of CPU time")
    parser.add_argument(
        "--top", type=int, default=0, help="with --opcodes: the N functions that run the most"
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        try:  # the server's own loop (uvicorn picks uvloop when it is installed)
            import uvloop

            run = uvloop.run
        except ImportError:
            run = asyncio.run
        print(json.dumps(run(measure(args.requests, args.concurrency, args.opcodes))))
        return
    key = "opcodes_per_request" if args.opcodes else "cpu_us_per_request"
    rounds = args.rounds or (1 if args.opcodes else 3)
    runs: dict[str, list[dict]] = {str(r): [] for r in args.roots}
    for _ in range(rounds):
        for root in args.roots:  # this file, measuring the code of ``root``
            env = {**os.environ, "PYTHONPATH": str(root.resolve())}
            cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--requests", str(args.requests),
                   "--concurrency", str(args.concurrency), *(["--opcodes"] if args.opcodes else [])]  # fmt: skip
            out = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, check=True)
            runs[str(root)].append(json.loads(out.stdout.strip().splitlines()[-1]))
    label = "Python opcodes/request" if args.opcodes else "CPU us/request"
    print(f"{'tree':<50} {label + ' (median)':>30}  per round")
    for root, rows in runs.items():
        values = [r[key] for r in rows]
        print(f"{root:<50} {statistics.median(values):>30.1f}  {', '.join(f'{v:.1f}' for v in values)}")
    if args.opcodes and args.top:
        for root, rows in runs.items():
            print(f"\n{root}: the {args.top} functions that run the most opcodes per request")
            for name, n in list(rows[0]["by_function"].items())[: args.top]:
                print(f"{n:10.1f}  {name}")
    name = "route_opcodes" if args.opcodes else "route_cpu_cost"
    path = save(name, {"runs": runs, "requests": args.requests, "concurrency": args.concurrency})
    print(f"saved {path}")


if __name__ == "__main__":
    main()
