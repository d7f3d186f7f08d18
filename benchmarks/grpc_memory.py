"""Server memory under large gRPC messages (issue 22): is a request's memory bounded by its size?

    python -m benchmarks.grpc_memory [--root CHECKOUT] [--label L] [--sends 4]
                                     [--elements 10000000] [--element-bytes 3]

One ModelInferRequest of ``--elements`` BYTES elements in ``bytes_contents`` (about 50 MiB
with the defaults: 5 bytes on the wire per 3-byte element) is serialized once and sent
``--sends`` times, one after another, to a fresh server (``python -m wattserve serve``, the
zero-config identity model, gRPC on) for each case:

- ``unknown``: to a model the server does not have (Triton answers NOT_FOUND);
- ``known``: to ``identity``, whose INPUT0 is FP32 (the datatype check refuses it).

The server's RSS (psutil) is read before, after each send, and 2 s after the last, with
the peak sampled every 10 ms; the table is printed and the rows saved to
``results/grpc_memory-<label>.json``. ``--root`` runs another checkout's server (e.g. the
commit before a fix) with this client, for a before/after pair.
"""

from __future__ import annotations

import argparse
import contextlib
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import psutil
from rich.console import Console
from rich.table import Table
from tritonclient.grpc import service_pb2
from wattserve.loadgen.server_process import free_port, running_wattserve

from benchmarks._harness import save
from support.grpc_messages import METHOD, big_request

MIB = 1024 * 1024


class PeakRss:
    """The process's largest RSS, sampled every 10 ms while running."""

    def __init__(self, process: psutil.Process) -> None:
        self.process = process
        self.peak = process.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            try:
                self.peak = max(self.peak, self.process.memory_info().rss)
            except psutil.Error:
                return

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def run_case(case: str, payload: bytes, sends: int, root: Path | None) -> dict[str, Any]:
    grpc_port = free_port()
    env = {"WATTSERVE_MODEL": "identity", "WATTSERVE_GRPC_PORT": str(grpc_port),
           "WATTSERVE_TELEMETRY": "false", "WATTSERVE_LOG_LEVEL": "warning"}  # fmt: skip
    with running_wattserve(env, root=root) as server:
        process = psutil.Process(server.pid)
        options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}", options=options) as channel:
            call = channel.unary_unary(METHOD, request_serializer=None, response_deserializer=None)
            small = service_pb2.ModelInferRequest(model_name="nope").SerializeToString()
            with contextlib.suppress(grpc.RpcError):  # warm the channel and handler first
                call(small, timeout=30)
            time.sleep(0.5)
            before = process.memory_info().rss
            after_each, codes, seconds = [], [], []
            with PeakRss(process) as peak:
                for _ in range(sends):
                    start = time.perf_counter()
                    try:
                        call(payload, timeout=300)
                        codes.append("OK")
                    except grpc.RpcError as exc:
                        codes.append(exc.code().name)
                    seconds.append(round(time.perf_counter() - start, 3))
                    after_each.append(process.memory_info().rss)
                time.sleep(2.0)
                settled = process.memory_info().rss
            return {
                "case": case,
                "message_mib": round(len(payload) / MIB, 1),
                "sends": sends,
                "codes": codes,
                "seconds_each": seconds,
                "rss_before_mib": round(before / MIB),
                "rss_after_each_mib": [round(r / MIB) for r in after_each],
                "rss_peak_mib": round(peak.peak / MIB),
                "rss_settled_mib": round(settled / MIB),
                "growth_settled_mib": round((settled - before) / MIB),
            }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=None, help="checkout whose server to run")
    parser.add_argument("--label", default="current")
    parser.add_argument("--sends", type=int, default=4)
    parser.add_argument("--elements", type=int, default=10_000_000)
    parser.add_argument("--element-bytes", type=int, default=3)
    parser.add_argument("--cases", nargs="*", default=["unknown", "known"])
    args = parser.parse_args(argv)
    models = {"unknown": "no_such_model", "known": "identity"}
    rows = []
    for case in args.cases:
        payload = big_request(models[case], args.elements, args.element_bytes)
        rows.append(run_case(case, payload, args.sends, args.root))
        del payload
    table = Table(title=f"server RSS, {args.sends} x one gRPC message ({args.label})")
    for column in ("case", "message MiB", "answers", "s each", "RSS before", "after each", "peak",
                   "2 s later", "growth"):  # fmt: skip
        table.add_column(column)
    for r in rows:
        table.add_row(r["case"], str(r["message_mib"]), ",".join(sorted(set(r["codes"]))),
                      ",".join(map(str, r["seconds_each"])), str(r["rss_before_mib"]),
                      ",".join(map(str, r["rss_after_each_mib"])), str(r["rss_peak_mib"]),
                      str(r["rss_settled_mib"]), str(r["growth_settled_mib"]))  # fmt: skip
    Console().print(table)
    path = save(f"grpc_memory-{args.label}", {"label": args.label, "root": str(args.root or ""),
                                                   "rows": rows})  # fmt: skip
    print(f"saved {path}")


if __name__ == "__main__":
    main()
