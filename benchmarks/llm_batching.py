"""Token-level (continuous) vs request-level (dynamic) batching of one tiny language model.

One tiny random-weight GPT-2 folder (``support/tiny_lm.py``, built into ``--out``), one server
process per policy (``wattserve serve --model FOLDER``, torch on one thread so the client has
the other core), the same seeded open-loop Poisson arrivals for both at each of ``--rates``.
Each request streams from ``/v2/models/{m}/generate_stream`` (``ignore_eos``, so each
generates exactly its drawn length); prompt and output lengths are drawn once from a seeded
long-tailed (log-normal) distribution, as chat traffic's are. Measured per request, from its
*intended* send time (no coordinated omission): TTFT (first streamed token; under request-
level batching the text arrives whole at the end, so TTFT is the whole latency, which is
what its client sees) and TPOT ((last - first token) / (tokens - 1), token-level only: a
request-level answer has one arrival). Tokens/s: every output token / (last answer - first
intended send); ``tokens_per_s_during_arrivals`` in the JSON counts only the tokens received
before the last intended send (a whole answer's when it arrives), which under a short run
punishes request-level batching for its late answers more than its rate does. Joules per output token: the server's ``wattserve_energy_batch_joules_sum``
delta over the run / tokens, from CPU RAPL where the host has it, else from the simulated
GPU (``--simulated``, the default without RAPL), labelled with its source.

    python -m benchmarks.llm_batching --rates 2,6,12 --requests 60

Prints a table and writes ``results/llm_batching.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from pathlib import Path

import aiohttp
import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families
from wattserve.loadgen.server_process import running_wattserve

from benchmarks._harness import RESULTS, save
from support.tiny_lm import CORPUS, build_tiny_lm

MODEL = "tiny-lm"
POLICIES = {
    "token-level (continuous)": {"WATTSERVE_BATCHER": "continuous"},
    "request-level (dynamic)": {"WATTSERVE_BATCHER": "dynamic", "WATTSERVE_MAX_QUEUE_DELAY_MS": "10"},
}


def workload(n: int, rate: float, seed: int) -> list[tuple[float, str, int]]:
    """(send offset s, prompt, max_tokens) for ``n`` requests: Poisson arrivals, log-normal lengths."""
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate, n)
    offsets = np.cumsum(gaps) - gaps[0]
    words = " ".join(CORPUS).split()
    out = []
    for t in offsets:
        prompt_words = int(np.clip(rng.lognormal(2.5, 0.6), 3, 60))
        prompt = " ".join(rng.choice(words, prompt_words))
        tokens = int(np.clip(rng.lognormal(3.2, 0.8), 4, 160))
        out.append((float(t), prompt, tokens))
    return out


async def one(session: aiohttp.ClientSession, url: str, start: float, item: tuple[float, str, int]) -> dict:
    offset, prompt, max_tokens = item
    intended = start + offset
    await asyncio.sleep(max(0.0, intended - time.perf_counter()))
    body = {"text_input": prompt, "max_tokens": max_tokens, "ignore_eos": True}
    times: list[float] = []
    tokens = 0
    async with session.post(f"{url}/v2/models/{MODEL}/generate_stream", json=body) as resp:
        assert resp.status == 200, await resp.text()
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            assert "error" not in event, event
            ids = event["output_ids"]  # request-level: the whole row, padded with -1 to its batch's longest
            tokens += sum(1 for i in ids if i >= 0) if isinstance(ids, list) else 1
            times.append(time.perf_counter())
    assert tokens == max_tokens, (tokens, max_tokens)
    tpot = (times[-1] - times[0]) / (tokens - 1) if len(times) > 1 and tokens > 1 else None
    # receive time of each token: a streamed one when its event came, a whole answer's at its end
    arrived = times if len(times) == tokens else [times[-1]] * tokens
    return {"sent": intended, "ttft": times[0] - intended, "done": times[-1], "tokens": tokens, "tpot": tpot,
            "arrived": arrived}  # fmt: skip


def energy(url: str) -> tuple[float, str]:
    total, source = 0.0, "none"
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
        for s in family.samples:
            if s.name == "wattserve_energy_batch_joules_sum" and s.labels.get("model") == MODEL:
                total += s.value
                source = s.labels.get("source", source)
    return total, source


async def run(url: str, items: list[tuple[float, str, int]]) -> list[dict]:
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        start = time.perf_counter() + 0.2
        return await asyncio.gather(*(one(session, url, start, it) for it in items))


def summarize(policy: str, rate: float, results: list[dict], joules: float, source: str) -> dict:
    """One policy at one rate: the table's row (and print it)."""
    tokens = sum(r["tokens"] for r in results)
    first, last = min(r["sent"] for r in results), max(r["sent"] for r in results)
    in_window = sum(1 for r in results for t in r["arrived"] if t <= last)
    ttft = [r["ttft"] for r in results]
    tpot = [r["tpot"] for r in results if r["tpot"] is not None]
    row = {
        "policy": policy, "rate": rate, "requests": len(results), "tokens": tokens,
        "tokens_per_s": tokens / (max(r["done"] for r in results) - first),
        "tokens_per_s_during_arrivals": in_window / (last - first),
        "ttft_p50_s": pct(ttft, 50), "ttft_p99_s": pct(ttft, 99),
        "tpot_p50_s": pct(tpot, 50), "tpot_p99_s": pct(tpot, 99),
        "joules_per_token": joules / tokens if source != "none" else None,
        "energy_source": source,
    }  # fmt: skip
    tp = f"{row['tpot_p50_s'] * 1e3:7.1f} {row['tpot_p99_s'] * 1e3:7.1f}" if tpot else "      -       -"
    jpt = f"{row['joules_per_token']:.3f} ({source})" if row["joules_per_token"] is not None else "none"
    print(f"{policy:26s} {rate:5.1f} req/s  {row['tokens_per_s']:7.1f} tok/s  "
          f"TTFT p50/p99 {row['ttft_p50_s'] * 1e3:7.0f} {row['ttft_p99_s'] * 1e3:7.0f} ms  "
          f"TPOT p50/p99 {tp} ms  J/token {jpt}", flush=True)  # fmt: skip
    return row


def pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="2,6,12", help="requests/s, comma-separated")
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-running", type=int, default=16, help="max_batch_size of both policies")
    ap.add_argument("--hidden", type=int, default=384, help="the model's width")
    ap.add_argument("--layers", type=int, default=6, help="the model's depth")
    ap.add_argument("--out", type=Path, default=RESULTS / "llm_batching")
    ap.add_argument("--simulated", action=argparse.BooleanOptionalAction, default=None,
                    help="meter on the simulated GPU (default: only when the host has no RAPL)")  # fmt: skip
    args = ap.parse_args()
    folder = args.out / f"{MODEL}-{args.hidden}x{args.layers}" / MODEL
    if not (folder / "config.json").is_file():
        build_tiny_lm(folder, "gpt2", hidden=args.hidden, layers=args.layers, heads=4, context=512)
    simulated = args.simulated if args.simulated is not None else not Path("/sys/class/powercap").exists()
    env = {
        "WATTSERVE_MODEL": str(folder), "WATTSERVE_DEVICE": "cpu", "WATTSERVE_TORCH_THREADS": "1",
        "WATTSERVE_MAX_BATCH_SIZE": str(args.max_running), "WATTSERVE_MAX_QUEUE_SIZE": "4096",
        "WATTSERVE_MAX_QUEUE_WAIT_S": "0", "WATTSERVE_LM_KV_BLOCKS": "512", "WATTSERVE_LM_BLOCK_SIZE": "16",
        "WATTSERVE_LM_TOKEN_BUDGET": "256", "WATTSERVE_TELEMETRY_INTERVAL_MS": "100",
    }  # fmt: skip
    if simulated:
        env["WATTSERVE_SIMULATED_GPU"] = "default"
    rates = [float(r) for r in args.rates.split(",")]
    rows = []
    with contextlib.ExitStack() as stack:
        # both servers up at once, driven at the same moments: the machine's other load
        # (it is shared) falls on both alike, and the ratios are same-moment ratios
        urls = {
            policy: stack.enter_context(
                running_wattserve({**env, **policy_env, "WATTSERVE_LOG_LEVEL": "warning"})
            ).url
            for policy, policy_env in POLICIES.items()
        }
        for rate in rates:
            items = workload(args.requests, rate, args.seed)
            before = {p: energy(u)[0] for p, u in urls.items()}

            async def both(items: list[tuple[float, str, int]] = items) -> list[list[dict]]:
                return await asyncio.gather(*(run(u, items) for u in urls.values()))

            outcomes = dict(zip(urls, asyncio.run(both()), strict=True))
            time.sleep(0.5)  # the last iterations' energy lands one counter step later
            for policy, results in outcomes.items():
                joules1, source = energy(urls[policy])
                rows.append(summarize(policy, rate, results, joules1 - before[policy], source))
    top = max(rates)
    by = {r["policy"]: r for r in rows if r["rate"] == top}
    tok, req = by["token-level (continuous)"], by["request-level (dynamic)"]
    summary = {
        "rate": top,
        "tokens_per_s_ratio": tok["tokens_per_s"] / req["tokens_per_s"],
        "ttft_p99_ratio": tok["ttft_p99_s"] / req["ttft_p99_s"],
    }
    print(f"at {top} req/s: token-level / request-level tokens/s = {summary['tokens_per_s_ratio']:.2f}x, "
          f"TTFT p99 ratio = {summary['ttft_p99_ratio']:.2f}")  # fmt: skip
    path = save("llm_batching", {"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows,
                                 "summary": summary})  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
