"""Time of one language-model decode step vs the number of running sequences.

Why: token-level batching beats request-level batching only as far as a step's cost grows
sub-linearly with the sequences in it (a step over 32 sequences costing much less than 32
steps over one). This measures ``LMEngine.step`` alone (no server, no event loop) on the
tiny GPT-2 folder ``benchmarks/llm_batching.py`` serves (384 wide, 6 layers), torch on one
thread as there: each of ``--running`` sequences has its prompt prefilled and part of its output
generated (lengths drawn as the benchmark draws them), then ``--steps`` decode steps are timed: the median step of a round, the least over
``--rounds`` interleaved rounds (other work on a shared machine only adds time).

``--compare DIR`` also times the engine of another checkout (e.g. a ``git worktree`` of
main) in the same process, interleaved, so a before/after is one run on one machine state.
``--profile N`` prints cProfile's top functions of a step at N sequences.

    python -m benchmarks.lm_step_time --running 1,8,32
    python -m benchmarks.lm_step_time --running 1,8,32 --compare /work/wt-main
"""

from __future__ import annotations

import argparse
import cProfile
import importlib
import pstats
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks._harness import RESULTS, save
from support.tiny_lm import CORPUS, build_tiny_lm


def load_engine_class(root: Path | None) -> Any:
    """``LMEngine`` of this checkout, or of ``root`` (imported under another package name)."""
    if root is None:
        from wattserve.engines.lm_engine import LMEngine

        return LMEngine
    # The other checkout's modules import ``wattserve.engines.*``: swap the package's search
    # path to that checkout's engines folder while importing, then restore it.
    import wattserve.engines as pkg

    saved_path = list(pkg.__path__)
    saved = {k: v for k, v in sys.modules.items() if k.startswith("wattserve.engines.")}
    for k in saved:
        del sys.modules[k]
    pkg.__path__[:] = [str(root / "engines")]
    try:
        module = importlib.import_module("wattserve.engines.lm_engine")
    finally:
        pkg.__path__[:] = saved_path
        for k in [k for k in sys.modules if k.startswith("wattserve.engines.")]:
            del sys.modules[k]
        sys.modules.update(saved)
    return module.LMEngine


def decoding_states(engine: Any, n: int) -> list[Any]:
    """``n`` states mid-generation, their contexts spread as the benchmark's traffic makes them.

    Prompt and generated lengths are drawn (seeded) from ``benchmarks/llm_batching.py``'s
    log-normal distributions (a generation half done), so contexts range from ~10 to ~200
    tokens: what a step pads or buckets is what it meets under load."""
    rng = np.random.default_rng(n)
    words = " ".join(CORPUS).split()  # the benchmark's prompt words
    states, targets = [], []
    for _ in range(n):
        prompt_words = int(np.clip(rng.lognormal(2.5, 0.6), 3, 60))
        generated = int(np.clip(rng.lognormal(3.2, 0.8), 4, 160)) // 2 + 1
        text = " ".join(rng.choice(words, prompt_words))
        item = {
            "text_input": np.array([text.encode()], dtype=object),
            "max_tokens": np.array([300], np.int32),
            "ignore_eos": np.array([True]),
        }
        states.append(engine.start(item))
        targets.append(generated)
    while True:
        behind = [s for s, t in zip(states, targets, strict=True) if len(s.output) < t]
        if not behind:
            return states
        engine.step(behind)


def time_steps(engine: Any, states: list[Any], steps: int) -> float:
    """Median seconds of one decode step over ``states``."""
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        engine.step(states)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def modelled_ratio(c0: float, c1: float, engine: Any, requests: int = 150, running: int = 32) -> float:
    """Token-level / request-level tokens/s at saturation, from a step cost ``c0 + c1 * rows``.

    Why: what a step's cost curve allows, apart from the server and the machine's noise.
    The benchmark's requests (``llm_batching.workload``, prompts tokenized by ``engine``)
    all waiting: request-level runs batches of ``running`` until each batch's longest ends
    (finished rows leave the step), token-level keeps ``running`` sequences, admitting one
    as one ends. A prompt token is priced as a decode row (both policies compute the same
    prompts)."""
    from benchmarks.llm_batching import workload

    items = workload(requests, 30.0, 1)
    out = [n for _, _, n in items]
    prompt = [len(engine.tokenizer(p)["input_ids"]) for _, p, _ in items]
    tokens = sum(out)
    request_level = 0.0
    for i in range(0, requests, running):
        lengths = out[i : i + running]
        request_level += c0 + c1 * (sum(prompt[i : i + running]) + len(lengths))  # prefill + 1st token
        request_level += sum(c0 + c1 * sum(1 for n in lengths if n > k) for k in range(1, max(lengths)))
    token_level, waiting, left = 0.0, list(range(requests)), {}
    while waiting or left:
        rows = 0
        while waiting and len(left) < running:
            i = waiting.pop(0)
            left[i] = out[i]
            rows += prompt[i] - 1  # the prompt's other tokens, computed in this step
        token_level += c0 + c1 * (rows + len(left))
        for i in list(left):
            left[i] -= 1
            if left[i] == 0:
                del left[i]
    return (tokens / token_level) / (tokens / request_level)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--running", default="1,8,32", help="running sequences, comma-separated")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (the least of their medians)")
    ap.add_argument("--compare", type=Path, default=None, help="another checkout's root (the 'before')")
    ap.add_argument("--profile", type=int, default=0, help="cProfile a step at this many sequences")
    ap.add_argument("--hidden", type=int, default=384)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    folder = RESULTS / "llm_batching" / f"tiny-lm-{args.hidden}x{args.layers}" / "tiny-lm"
    if not (folder / "config.json").is_file():
        build_tiny_lm(folder, "gpt2", hidden=args.hidden, layers=args.layers, heads=4, context=512)
    classes = {"this": load_engine_class(None)}
    if args.compare is not None:
        classes = {"before": load_engine_class(args.compare.resolve()), "after": classes["this"]}
    engines = {
        k: cls("tiny-lm", model_path=folder, device="cpu", kv_blocks=512, block_size=16, token_budget=256,
               max_batch_size=64)
        for k, cls in classes.items()
    }  # fmt: skip
    counts = [int(n) for n in args.running.split(",")]
    if args.profile:
        for name, engine in engines.items():
            states = decoding_states(engine, args.profile)
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(args.steps):
                engine.step(states)
            prof.disable()
            for s in states:
                engine.release(s)
            print(f"--- {name}: {args.steps} steps at {args.profile} running")
            pstats.Stats(prof).sort_stats("tottime").print_stats(18)
    medians: dict[str, dict[int, list[float]]] = {k: {n: [] for n in counts} for k in engines}
    for _ in range(args.rounds):
        for n in counts:
            for name, engine in engines.items():
                states = decoding_states(engine, n)
                medians[name][n].append(time_steps(engine, states, args.steps))
                for s in states:
                    engine.release(s)
    rows: list[dict[str, Any]] = []
    fits: list[dict[str, Any]] = []
    print(f"{'engine':8s} {'running':>7s} {'step ms':>8s} {'ms/seq':>7s} {'tok/s':>7s}")
    for name in engines:
        for n in counts:
            t = min(medians[name][n])  # a shared machine only ever adds time: the least is the cost
            rows.append({"engine": name, "running": n, "step_s": t, "tokens_per_s": n / t})
            print(f"{name:8s} {n:7d} {t * 1e3:8.2f} {t * 1e3 / n:7.3f} {n / t:7.0f}")
        if len(counts) > 1:  # the step cost's line through the fewest and the most running
            lo, hi = min(counts), max(counts)
            t_lo, t_hi = (min(medians[name][n]) for n in (lo, hi))
            c1 = (t_hi - t_lo) / (hi - lo)
            c0 = t_lo - c1 * lo
            ratio = modelled_ratio(c0, c1, engines[name])
            fits.append({"engine": name, "c0_s": c0, "c1_s": c1, "modelled_ratio_at_saturation": ratio})
            print(f"{name:8s} step = {c0 * 1e3:.2f} ms + {c1 * 1e3:.3f} ms x rows; "
                  f"modelled token-/request-level tokens/s at saturation: {ratio:.2f}x")  # fmt: skip
    path = save(
        "lm_step_time", {"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows, "fits": fits}
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
