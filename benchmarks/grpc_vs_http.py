"""gRPC vs HTTP on one server: the same batchers behind both, so the difference is the
protocol front end (framing, decode, encode) and its client.

1. identity (16 FP32 elements), 16 concurrent closed-loop clients, HTTP with the binary
   tensor extension vs gRPC raw contents; rounds alternate (http, grpc, http, grpc, ...) in
   one run against one server. req/s and p50/p99 from every request's latency.
2. mobilenet_v2 (torch, random weights), 16 concurrent clients, throughput at saturation
   (img/s) over each protocol, alternating rounds.

Both clients are Python asyncio in this process (aiohttp with a prebuilt body; grpc.aio with
a prebuilt ModelInferRequest), so each side pays a comparable client cost; the server is a
subprocess (``python -m wattserve serve``) whose own CPU time per request is reported too: on a
machine where client and server share the cores, req/s partly measures the clients, while
server CPU per request is the protocol's cost to the server. The machine may be shared:
compare the two protocols as ratios within one run, never across runs.

    python -m benchmarks.grpc_vs_http [--seconds 5] [--rounds 3] [--model-seconds 8] [--model-rounds 2]

Prints a table and writes results/grpc_vs_http.json.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import time
from collections.abc import Awaitable, Callable

import aiohttp
import grpc
import numpy as np
import orjson
from tritonclient.grpc import service_pb2, service_pb2_grpc
from wattserve.loadgen.server_process import running_wattserve

from benchmarks._harness import free_port, save

CLIENTS = 16


def http_request(model: str, name: str, array: np.ndarray) -> tuple[bytes, dict[str, str]]:
    """A binary-extension request (what tritonclient.http sends with binary_data=True)."""
    header = orjson.dumps({
        "inputs": [{"name": name, "shape": list(array.shape), "datatype": "FP32",
                    "parameters": {"binary_data_size": array.nbytes}}],
        "parameters": {"binary_data_output": True},
    })  # fmt: skip
    return header + array.tobytes(), {"Inference-Header-Content-Length": str(len(header)),
                                      "Content-Type": "application/octet-stream"}  # fmt: skip


def grpc_request(model: str, name: str, array: np.ndarray) -> service_pb2.ModelInferRequest:
    """Raw contents (what tritonclient.grpc sends)."""
    request = service_pb2.ModelInferRequest(model_name=model)
    request.inputs.add(name=name, datatype="FP32", shape=list(array.shape))
    request.raw_input_contents.append(array.tobytes())
    return request


async def closed_loop(call: Callable[[], Awaitable[None]], seconds: float, clients: int) -> dict:
    """``clients`` workers each sending back to back for ``seconds``; every latency kept."""
    latencies: list[float] = []
    errors = 0
    stop_at = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal errors
        while time.perf_counter() < stop_at:
            t0 = time.perf_counter()
            try:
                await call()
            except Exception:
                errors += 1
                continue
            latencies.append(time.perf_counter() - t0)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    wall = time.perf_counter() - started
    ms = np.array(latencies) * 1e3
    return {
        "requests": len(latencies),
        "errors": errors,
        "rps": len(latencies) / wall,
        "p50_ms": float(np.percentile(ms, 50)) if len(ms) else None,
        "p99_ms": float(np.percentile(ms, 99)) if len(ms) else None,
    }


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (all its threads), from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def alternate(url: str, grpc_address: str, server_pid: int, model: str, name: str, array: np.ndarray,
                    seconds: float, rounds: int) -> dict[str, list[dict]]:  # fmt: skip
    body, headers = http_request(model, name, array)
    message = grpc_request(model, name, array)
    infer_url = f"{url}/v2/models/{model}/infer"
    out: dict[str, list[dict]] = {"http": [], "grpc": []}
    connector = aiohttp.TCPConnector(limit=CLIENTS)
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        grpc.aio.insecure_channel(
            grpc_address,
            options=[("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)],
        ) as channel,
    ):
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)

        async def over_http() -> None:
            async with session.post(infer_url, data=body, headers=headers) as response:
                await response.read()
                if response.status != 200:
                    raise RuntimeError(response.status)

        async def over_grpc() -> None:
            await stub.ModelInfer(message)

        for call in (over_http, over_grpc):  # warm both
            await closed_loop(call, 1.0, CLIENTS)
        for i in range(rounds):
            for proto, call in (("http", over_http), ("grpc", over_grpc)):
                cpu_before = cpu_seconds(server_pid)
                result = await closed_loop(call, seconds, CLIENTS)
                cpu = cpu_seconds(server_pid) - cpu_before
                result["server_cpu_ms_per_request"] = cpu * 1e3 / max(1, result["requests"])
                out[proto].append(result)
                print(f"  {model} round {i + 1} {proto:4}: {result['rps']:8.1f} req/s  p50 "
                      f"{result['p50_ms']:.2f} ms  p99 {result['p99_ms']:.2f} ms  server CPU "
                      f"{result['server_cpu_ms_per_request']:.3f} ms/req  errors {result['errors']}")  # fmt: skip
    return out


def summary(rounds: list[dict]) -> dict:
    return {
        "rps_median": float(np.median([r["rps"] for r in rounds])),
        "p99_ms_median": float(np.median([r["p99_ms"] for r in rounds])),
        "p50_ms_median": float(np.median([r["p50_ms"] for r in rounds])),
        "server_cpu_ms_per_request_median": float(
            np.median([r["server_cpu_ms_per_request"] for r in rounds])
        ),
        "errors": sum(r["errors"] for r in rounds),
    }


def run_case(
    env: dict[str, str], model: str, name: str, array: np.ndarray, seconds: float, rounds: int
) -> dict:
    grpc_port = free_port()
    env = {"WATTSERVE_LOG_LEVEL": "warning", **env, "WATTSERVE_GRPC_PORT": str(grpc_port)}
    with running_wattserve(env) as server:
        raw = asyncio.run(
            alternate(
                server.url, f"127.0.0.1:{grpc_port}", server.proc.pid, model, name, array, seconds, rounds
            )
        )
    return {"rounds": raw, "http": summary(raw["http"]), "grpc": summary(raw["grpc"])}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=5.0, help="identity: seconds per round")
    parser.add_argument("--rounds", type=int, default=3, help="identity: rounds per protocol")
    parser.add_argument("--model-seconds", type=float, default=8.0, help="mobilenet_v2: seconds per round")
    parser.add_argument("--model-rounds", type=int, default=2, help="mobilenet_v2: rounds per protocol")
    parser.add_argument("--skip-model", action="store_true", help="identity only")
    args = parser.parse_args()

    identity_env = {"WATTSERVE_MODEL": "identity", "WATTSERVE_IDENTITY_ELEMENTS": "16",
                    "WATTSERVE_BATCHER": "dynamic", "WATTSERVE_MAX_BATCH_SIZE": "16",
                    "WATTSERVE_MAX_QUEUE_DELAY_MS": "0", "WATTSERVE_TELEMETRY": "false"}  # fmt: skip
    print(f"identity, {CLIENTS} concurrent clients, alternating rounds of {args.seconds:g} s")
    identity = run_case(identity_env, "identity", "INPUT0", np.arange(16, dtype=np.float32).reshape(1, 16),
                        args.seconds, args.rounds)  # fmt: skip
    doc = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "note": "shared with other agents while measured; compare ratios within this run"},
        "clients": CLIENTS,
        "identity": identity,
    }  # fmt: skip
    if not args.skip_model:
        model_env = {"WATTSERVE_MODEL": "mobilenet_v2", "WATTSERVE_BATCHER": "dynamic",
                     "WATTSERVE_MAX_BATCH_SIZE": "8", "WATTSERVE_MAX_QUEUE_DELAY_MS": "2",
                     "WATTSERVE_TELEMETRY": "false"}  # fmt: skip
        image = np.random.default_rng(0).standard_normal((1, 3, 224, 224), dtype=np.float32)
        print(f"mobilenet_v2 (torch, CPU), {CLIENTS} concurrent clients, rounds of {args.model_seconds:g} s")
        doc["mobilenet_v2"] = run_case(model_env, "mobilenet_v2", "input", image, args.model_seconds,
                                       args.model_rounds)  # fmt: skip

    print("\n| case | protocol | req/s (median of rounds) | p50 ms | p99 ms | server CPU ms/req | errors |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for case in ("identity", "mobilenet_v2"):
        if case not in doc:
            continue
        for proto in ("http", "grpc"):
            s = doc[case][proto]
            print(f"| {case} | {proto} | {s['rps_median']:.1f} | {s['p50_ms_median']:.2f} | "
                  f"{s['p99_ms_median']:.2f} | {s['server_cpu_ms_per_request_median']:.3f} | {s['errors']} |")  # fmt: skip
        ratio = doc[case]["grpc"]["rps_median"] / doc[case]["http"]["rps_median"]
        doc[case]["grpc_over_http_rps"] = ratio
        print(f"| {case} | grpc/http | {ratio:.2f}x | | | | |")
    print("(machine shared with other agents: numbers are noisy; the ratio within this run is the result)")
    print(f"saved {save('grpc_vs_http', doc)}")


if __name__ == "__main__":
    main()
