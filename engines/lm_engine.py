"""A causal language model as a StepEngine: token-level continuous batching, paged KV cache.

One request = one generation. Inputs (one element each; all but ``text_input`` optional,
filled in by ``prepare`` before the request is queued):

- ``text_input`` BYTES (UTF-8 prompt), ``max_tokens`` INT32 (0: the configured default);
- ``temperature`` FP32 (0: greedy, the default), ``top_p`` FP32 (1: off), ``top_k`` INT32
  (0: off), ``seed`` INT64 (-1: none; a sampled request without one draws a fresh seed);
- ``stop`` BYTES (a JSON list of stop strings, or one plain string), ``ignore_eos`` BOOL;
- ``stream`` BOOL, for the streaming front ends alone (false: one answer, not one per
  token; Triton's vLLM and TensorRT-LLM backends take it as an input): ``prepare`` drops it.

Outputs: ``text_output`` BYTES (the generated text, stop string excluded), ``output_ids``
INT64 [-1] (the generated tokens, an end-of-sequence token included as Hugging Face's
``generate`` returns it), ``finish_reason`` BYTES (``stop`` or ``length``), ``prompt_tokens``
INT32 (the prompt's length in tokens, for usage counts).

One ``step(states)`` is one model call: ``engines/lm_schedule.py`` decides, from the
states' positions, the token budget and the free KV blocks, how many tokens each state
computes (a prefill chunk, a whole prompt, or one decode token) and which are preempted;
the step allocates their blocks (``engines/kv_blocks.py``), runs every run in one forward
(``engines/lm_model.py``), and samples a next token for each state whose run reached its
last known token (``engines/lm_sampling.py``). A finished state's blocks go back at once;
a state the batcher drops (deadline, client gone) goes back through ``release``. A request
longer than the whole pool is refused at ``start`` (400), so every accepted request fits
alone and the oldest always progresses: no out-of-memory error, no request stuck.

The request-level ``infer`` (static/dynamic batchers) runs the same ``step`` over its batch
until every request is done, with no token budget (whole prompts at once): the two
batchings serve one model and one cache, for side-by-side comparison.
"""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from time import monotonic
from typing import Any, Protocol

import numpy as np
import torch
from wattserve.engines.base import EngineError, StepObserver, TensorSpec
from wattserve.engines.kv_blocks import BlockAllocator
from wattserve.engines.lm_model import PagedCausalLM, Run, load_causal_lm
from wattserve.engines.lm_sampling import SamplingParams, choose_rows, make_generator
from wattserve.engines.lm_schedule import SeqView, TokenPlan, blocks_needed, schedule_tokens
from wattserve.engines.request_values import read_number, read_scalar, read_text
from wattserve.engines.torch_engine import resolve_device

log = logging.getLogger("wattserve.engine.lm")

MAX_PROMPT_BYTES = 1 << 20
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

INPUTS = [
    TensorSpec("text_input", (1,), "BYTES"),
    TensorSpec("max_tokens", (1,), "INT32", optional=True),
    TensorSpec("temperature", (1,), "FP32", optional=True),
    TensorSpec("top_p", (1,), "FP32", optional=True),
    TensorSpec("top_k", (1,), "INT32", optional=True),
    TensorSpec("seed", (1,), "INT64", optional=True),
    TensorSpec("stop", (1,), "BYTES", optional=True),
    TensorSpec("ignore_eos", (1,), "BOOL", optional=True),
    TensorSpec("stream", (1,), "BOOL", optional=True),
]
OUTPUTS = [
    TensorSpec("text_output", (1,), "BYTES"),
    TensorSpec("output_ids", (-1,), "INT64"),
    TensorSpec("finish_reason", (1,), "BYTES"),
    TensorSpec("prompt_tokens", (1,), "INT32"),
]


class TokenSink(Protocol):
    """Where a streaming request's text goes, token by token (called on the engine thread)."""

    def __call__(self, delta: str, token: int, finish_reason: str | None, prompt_tokens: int) -> None: ...


@dataclass(eq=False)
class LMState:
    """One generation in flight: its tokens, its block table, its own generator."""

    key: int
    order: int
    prompt: list[int]
    params: SamplingParams
    generator: torch.Generator | None
    priority: int = 1  # the batcher may set it from the request's priority level
    output: list[int] = field(default_factory=list)
    blocks: list[int] = field(default_factory=list)
    computed: int = 0  # tokens whose keys/values are cached
    text: str = ""
    finish_reason: str | None = None
    preemptions: int = 0
    started_at: float = 0.0
    arrival: float = 0.0  # the request's arrival (the batcher sets it; TTFT counts from it)
    token_times: list[float] = field(default_factory=list)  # monotonic time of each output token
    # the front end's request (the batcher copies it from the work item): when it has a
    # ``token_sink``, every new piece of text goes there as it is generated (streaming)
    context: Any = None
    sent: int = 0  # characters of ``text`` already handed to the sink

    @property
    def total(self) -> int:
        return len(self.prompt) + len(self.output)

    def token(self, i: int) -> int:
        p = len(self.prompt)
        return self.prompt[i] if i < p else self.output[i - p]


class LMEngine:
    """A local Hugging Face causal LM folder, served token by token. Blocking; one thread."""

    platform = "transformers"
    streams_tokens = True  # the front ends may set a request's ``token_sink``

    def __init__(
        self,
        name: str,
        *,
        model_path: Path | str,
        device: str = "auto",
        dtype: str = "float32",
        kv_blocks: int = 512,
        block_size: int = 16,
        token_budget: int = 512,
        max_batch_size: int = 16,
        chunked_prefill: bool = True,
        default_max_tokens: int = 16,
        threads: int | None = None,
    ) -> None:
        from transformers import AutoTokenizer, GenerationConfig

        self.name = name
        self._device = resolve_device(device)
        self.device = str(self._device)
        if threads is not None and self._device.type == "cpu":
            torch.set_num_threads(threads)
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
        torch_dtype = DTYPES[dtype] if self._device.type == "cuda" else torch.float32
        path = Path(model_path)
        if not (path / "config.json").is_file():
            raise EngineError(f"{path} is not a Hugging Face model folder (no config.json)")
        self.model_path = path
        self.model = PagedCausalLM(load_causal_lm(path, self._device, torch_dtype), kv_blocks, block_size)
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.eos_ids = _eos_ids(path, self.model.model.config, self.tokenizer, GenerationConfig)
        self._decode = _decoder(self.tokenizer)
        self.blocks = BlockAllocator(kv_blocks, block_size)
        self.token_budget = token_budget
        self.chunked_prefill = chunked_prefill
        self.default_max_tokens = default_max_tokens
        self.max_batch_size = max_batch_size
        self.batch_sizes: list[int] | None = None
        self.inputs = INPUTS
        self.outputs = OUTPUTS
        self.max_context = kv_blocks * block_size
        if self.model.max_positions:
            self.max_context = min(self.max_context, self.model.max_positions)
        self.preemptions = 0  # every preemption since start (read by metrics)
        self._keys = itertools.count()
        self.step_observer: StepObserver | None = None
        # Called on the engine thread after each step with the states that got a token.
        self.token_observer: Any = None

    # ------------------------------------------------------------------ request checks
    def parse(self, item: Mapping[str, np.ndarray]) -> tuple[list[int], SamplingParams]:
        """Prompt tokens and decoding settings of one request, or ValueError (the client's 400)."""
        prompt = read_text(item, "text_input", MAX_PROMPT_BYTES, required=True)
        ids = list(self.tokenizer(prompt, add_special_tokens=True)["input_ids"])
        if not ids:
            bos = self.tokenizer.bos_token_id
            if bos is None:
                raise ValueError("text_input is empty (and the tokenizer has no BOS token)")
            ids = [int(bos)]
        max_tokens = read_number(item, "max_tokens", 0) or self.default_max_tokens
        seed = read_number(item, "seed", -1)
        stop_text = read_text(item, "stop", MAX_PROMPT_BYTES)
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=float(read_scalar(item, "temperature", 0.0)),
            top_p=float(read_scalar(item, "top_p", 1.0)),
            top_k=read_number(item, "top_k", 0),
            seed=None if seed < 0 else seed,
            stop=_stops(stop_text),
            ignore_eos=bool(read_scalar(item, "ignore_eos", False)),
        )
        if len(ids) + params.max_tokens > self.max_context:
            raise ValueError(
                f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) exceeds the "
                f"model's context here ({self.max_context} tokens)"
            )
        return ids, params

    def prepare(self, inputs: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], tuple | None]:
        """A whole request (one row) checked, its optional inputs filled in; one batch key."""
        rows = {len(v) for v in inputs.values()}
        if rows != {1}:
            raise ValueError(f"one generation per request: every input needs one row, got {sorted(rows)}")
        row = {name: value[0] for name, value in inputs.items()}
        _, params = self.parse(row)
        filled = {
            "text_input": np.array(
                [[read_text(row, "text_input", MAX_PROMPT_BYTES, required=True).encode()]], dtype=object
            ),
            "max_tokens": np.array([[params.max_tokens]], np.int32),
            "temperature": np.array([[params.temperature]], np.float32),
            "top_p": np.array([[params.top_p]], np.float32),
            "top_k": np.array([[params.top_k]], np.int32),
            "seed": np.array([[-1 if params.seed is None else params.seed]], np.int64),
            "stop": np.array([[json.dumps(list(params.stop)).encode()]], dtype=object),
            "ignore_eos": np.array([[params.ignore_eos]], np.bool_),
        }
        return filled, None

    # ------------------------------------------------------------------ step contract
    def start(self, item: Mapping[str, np.ndarray]) -> LMState:
        """A request's state: its prompt tokens and generator; no KV block yet."""
        ids, params = self.parse(item)
        key = next(self._keys)
        now = monotonic()
        return LMState(key, key, ids, params, make_generator(params), started_at=now, arrival=now)

    def step(self, states: Sequence[LMState]) -> None:
        """One model call over ``states`` as the token plan says (see the module docstring)."""
        self._step(states, self.token_budget, self.chunked_prefill)

    def plan(self, states: Sequence[LMState], budget: int, chunked: bool) -> TokenPlan:
        views = [
            SeqView(s.key, s.priority, s.order, s.total, s.computed, len(s.blocks))
            for s in states
            if s.finish_reason is None
        ]
        return schedule_tokens(views, budget, self.blocks.free, self.blocks.block_size, chunked=chunked)

    def _step(self, states: Sequence[LMState], budget: int, chunked: bool) -> None:
        for s in states:
            if s.finish_reason is not None:
                raise EngineError("step() called on a finished state")
        began = monotonic()
        plan = self.plan(states, budget, chunked)
        by_key = {s.key: s for s in states}
        for key in plan.preempt:
            s = by_key[key]
            self.release(s)
            s.preemptions += 1
            self.preemptions += 1
        chosen = [(by_key[k], n) for k, n in plan.chunks.items()]
        runs = []
        for s, n in chosen:
            need = blocks_needed(s.computed + n, self.blocks.block_size) - len(s.blocks)
            if need > 0:
                s.blocks.extend(self.blocks.allocate(need))
            runs.append(Run([s.token(i) for i in range(s.computed, s.computed + n)], s.computed, s.blocks))
        if not runs:
            return
        logits = self.model.forward(runs)
        now = monotonic()
        due = []  # rows whose run reached the last known token: each gets one more token
        for i, (s, n) in enumerate(chosen):
            s.computed += n
            if s.computed == s.total:
                due.append(i)
        grew = [chosen[i][0] for i in due]
        rows = logits if len(due) == len(chosen) else logits[due]
        tokens = choose_rows(rows, [s.params for s in grew], [s.generator for s in grew])
        for s, token in zip(grew, tokens, strict=True):
            self._append(s, token, now)
        if self.step_observer is not None:
            self.step_observer(len(runs), monotonic() - began)
        if self.token_observer is not None:
            self.token_observer(grew)

    def _append(self, s: LMState, token: int, now: float) -> None:
        s.output.append(token)
        s.token_times.append(now)
        p = s.params
        reason = None
        if (token in self.eos_ids and not p.ignore_eos) or token in p.stop_token_ids:
            reason = "stop"
        if reason is None and (len(s.output) >= p.max_tokens or s.total >= self.max_context):
            reason = "length"
        sink = getattr(s.context, "token_sink", None)
        # The text is read by stop strings, the stream and the answer: a generation with
        # neither stop strings nor a sink decodes once, when it ends (a re-decode of the
        # whole output per token grows with its length).
        if p.stop or sink is not None or reason is not None:
            text = self._decode(s.output)
            for stop in p.stop:
                at = text.find(stop)
                if at >= 0:
                    text, reason = text[:at], "stop"
            s.text = text
        if reason is not None:
            s.finish_reason = reason
            self.release(s)
        if sink is not None:
            self._stream(s, sink)

    def _stream(self, s: LMState, sink: TokenSink) -> None:
        """Hand the sink the text that is settled: an unfinished byte sequence (U+FFFD at
        the end) and a tail that may still grow into a stop string wait for the next token."""
        settled = s.text
        if s.finish_reason is None:
            settled = settled.rstrip("\ufffd")
            hold = max((len(stop) - 1 for stop in s.params.stop), default=0)
            if hold:
                settled = settled[: max(len(settled) - hold, s.sent)]
        delta = settled[s.sent :] if settled.startswith(s.text[: s.sent]) else ""
        s.sent += len(delta)
        sink(delta, s.output[-1], s.finish_reason, len(s.prompt))

    def release(self, state: LMState) -> None:
        """Give a state's KV blocks back (finished, preempted, or dropped by the batcher)."""
        if state.blocks:
            self.blocks.release(state.blocks)
        state.blocks = []
        state.computed = 0

    def finished(self, state: LMState) -> bool:
        return state.finish_reason is not None

    def result(self, state: LMState) -> dict[str, np.ndarray]:
        if state.finish_reason is None:
            raise EngineError(f"result() asked after {len(state.output)} tokens, not finished")
        return {
            "text_output": np.array([state.text.encode()], dtype=object),
            "output_ids": np.array(state.output, np.int64),
            "finish_reason": np.array([state.finish_reason.encode()], dtype=object),
            "prompt_tokens": np.array([len(state.prompt)], np.int32),
        }

    # ------------------------------------------------------------------ request contract
    def infer(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Request-level batching: every generation of the batch runs to its end together."""
        n = len(batch["text_input"])
        states = [self.start({name: value[i] for name, value in batch.items()}) for i in range(n)]
        try:
            active = list(states)
            while active:
                self._step(active, max(sum(s.total for s in active), 1), False)
                active = [s for s in active if s.finish_reason is None]
        finally:
            for s in states:
                self.release(s)
        results = [self.result(s) for s in states]
        width = max(len(r["output_ids"]) for r in results)
        ids = np.full((n, width), -1, np.int64)  # padded with -1 past each generation's end
        for i, r in enumerate(results):
            ids[i, : len(r["output_ids"])] = r["output_ids"]
        return {
            "text_output": np.stack([r["text_output"] for r in results]),
            "output_ids": ids,
            "finish_reason": np.stack([r["finish_reason"] for r in results]),
            "prompt_tokens": np.stack([r["prompt_tokens"] for r in results]),
        }

    def warmup(self, batch_sizes: Sequence[int]) -> None:
        """A two-token generation at each batch size (allocator and kernels warmed)."""
        item = {"text_input": np.array([b"hello"], dtype=object), "max_tokens": np.array([2], np.int32)}
        observers = self.step_observer, self.token_observer
        self.step_observer = self.token_observer = None  # warm-up is not traffic
        try:
            for n in batch_sizes:
                states = [self.start(item) for _ in range(n)]
                try:
                    while any(s.finish_reason is None for s in states):
                        self.step([s for s in states if s.finish_reason is None])
                finally:
                    for s in states:
                        self.release(s)
        finally:
            self.step_observer, self.token_observer = observers

    def close(self) -> None:
        self.model = None  # type: ignore[assignment]  # the pool and weights go with it
        if self._device.type == "cuda":
            torch.cuda.empty_cache()


def _decoder(tokenizer: Any) -> Any:
    """``tokenizer.decode(ids, skip_special_tokens=True)`` for a list of ints, minus its wrapper.

    Why: ``decode`` first walks every id to check it is a number (``to_py_obj``), which cost
    more than the Rust decode itself, per token of every running generation; for a list of
    ints it then calls ``_decode``, which is what this calls (the public method where a
    tokenizer has no ``_decode``)."""
    inner = getattr(tokenizer, "_decode", None)
    if inner is None:
        return lambda ids: str(tokenizer.decode(ids, skip_special_tokens=True))
    return lambda ids: str(inner(token_ids=ids, skip_special_tokens=True))


def _eos_ids(path: Path, config: Any, tokenizer: Any, generation_config: Any) -> frozenset[int]:
    """End-of-sequence ids as ``generate`` reads them: generation_config.json, else config."""
    eos: Any = None
    if (path / "generation_config.json").is_file():
        eos = generation_config.from_pretrained(path, local_files_only=True).eos_token_id
    if eos is None:
        eos = getattr(config, "eos_token_id", None)
    if eos is None:
        eos = tokenizer.eos_token_id
    if eos is None:
        return frozenset()
    return frozenset(int(e) for e in (eos if isinstance(eos, list | tuple) else [eos]))


def _stops(text: str) -> tuple[str, ...]:
    """A JSON list of stop strings, or one plain stop string ('' for none)."""
    if not text:
        return ()
    if text.startswith("["):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"stop is not a JSON list of strings ({exc})") from exc
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise ValueError("stop must be a list of non-empty strings")
        return tuple(value)
    return (text,)
