"""What a language-model load test sends: prompts and output lengths, drawn from a seeded
length distribution or read from a ShareGPT-like file the user has.

Lengths are computed in full before the run (as the arrival schedule is), so the same seed
gives every server under test the same prompts and the same ``max_tokens``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

DISTRIBUTIONS = ("fixed", "uniform", "normal")
# The words random prompts are made of: short, common English words, each one token in most
# tokenizers, so a prompt of N words is about N tokens (the server's count is recorded).
_WORDS_TEXT = (
    "the of and to in is it that for on with as was at by be this from or have an are not "
    "but what all were when we there can more if no out so up said about into than them "
    "only other time new some could these two may first then do any like my now over such "
    "our man me even most made after also did many before must through back years where much "
    "your way well down should because each just those people how too little state good very"
)
WORDS = tuple(_WORDS_TEXT.split())
HUMAN_ROLES = ("human", "user")
MODEL_ROLES = ("gpt", "assistant", "model", "chatgpt", "bard")


@dataclass(frozen=True)
class LMItem:
    """One request's text and the most tokens it asks for."""

    prompt: str
    max_tokens: int


@dataclass(frozen=True)
class LengthDist:
    """A length distribution: ``fixed:N``, ``uniform:LO,HI`` (inclusive) or ``normal:MEAN,STD``
    (rounded, at least ``minimum``)."""

    kind: str
    a: float
    b: float = 0.0
    minimum: int = 1

    @classmethod
    def parse(cls, text: str, minimum: int = 1) -> LengthDist:
        """``"fixed:64"``, ``"64"``, ``"uniform:16,128"``, ``"normal:64,16"``; ValueError with
        the accepted forms otherwise."""
        kind, _, rest = text.strip().partition(":")
        if not rest:
            kind, rest = "fixed", kind
        try:
            values = [float(v) for v in rest.split(",")]
        except ValueError:
            raise ValueError(f"bad length distribution {text!r}: {FORMS}") from None
        want = 1 if kind == "fixed" else 2
        if kind not in DISTRIBUTIONS or len(values) != want:
            raise ValueError(f"bad length distribution {text!r}: {FORMS}")
        dist = cls(kind, values[0], values[1] if want == 2 else 0.0, minimum)
        if kind == "fixed" and dist.a < minimum:
            raise ValueError(f"{text!r}: a length must be at least {minimum}")
        if kind == "uniform" and not minimum <= dist.a <= dist.b:
            raise ValueError(f"{text!r}: uniform needs {minimum} <= LO <= HI")
        if kind == "normal" and (dist.a < minimum or dist.b < 0):
            raise ValueError(f"{text!r}: normal needs MEAN >= {minimum} and STD >= 0")
        return dist

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` integer lengths."""
        if self.kind == "fixed":
            values = np.full(n, self.a)
        elif self.kind == "uniform":
            values = rng.integers(int(self.a), int(self.b), size=n, endpoint=True).astype(np.float64)
        else:
            values = rng.normal(self.a, self.b, size=n)
        return np.maximum(np.rint(values), self.minimum).astype(np.int64)

    def describe(self) -> str:
        if self.kind == "fixed":
            return f"fixed:{self.a:g}"
        return f"{self.kind}:{self.a:g},{self.b:g}"


FORMS = "expected fixed:N (or N), uniform:LO,HI or normal:MEAN,STD"


def random_prompt(words: int, rng: np.random.Generator) -> str:
    """``words`` words drawn from ``WORDS``."""
    return " ".join(rng.choice(WORDS, size=words).tolist())


def synthetic_items(n: int, prompt_len: LengthDist, output_len: LengthDist, seed: int) -> list[LMItem]:
    """``n`` items: prompts of ``prompt_len`` words, ``max_tokens`` from ``output_len``."""
    rng = np.random.default_rng(seed)
    prompts = prompt_len.sample(n, rng)
    outputs = output_len.sample(n, rng)
    return [LMItem(random_prompt(int(p), rng), int(o)) for p, o in zip(prompts, outputs, strict=True)]


def word_count(text: str) -> int:
    return len(text.split())


def read_sharegpt(
    path: str | Path,
    count_tokens: Callable[[str], int] = word_count,
    limit: int | None = None,
) -> list[LMItem]:
    """ShareGPT-like JSON: a list of conversations, each ``{"conversations": [turn, ...]}``
    (or a bare list of turns); a turn is ``{"from": "human"|"gpt", "value": TEXT}`` or
    ``{"role": "user"|"assistant", "content": TEXT}``. The first human turn is the prompt, the
    length of the first model turn after it (``count_tokens``: words unless a tokenizer is
    given) is ``max_tokens``. Conversations without both, or with an empty answer, are skipped;
    a file with none left is a ValueError."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None
    if not isinstance(doc, list):
        raise ValueError(f"{path}: expected a JSON list of conversations")
    items: list[LMItem] = []
    for entry in doc:
        turns = entry.get("conversations", entry.get("messages")) if isinstance(entry, dict) else entry
        pair = _first_exchange(turns) if isinstance(turns, list) else None
        if pair is None:
            continue
        length = count_tokens(pair[1])
        if length >= 1:
            items.append(LMItem(pair[0], length))
        if limit is not None and len(items) >= limit:
            break
    if not items:
        raise ValueError(f"{path}: no conversation with a human turn followed by a model turn")
    return items


def _first_exchange(turns: list[Any]) -> tuple[str, str] | None:
    prompt: str | None = None
    for turn in turns:
        if not isinstance(turn, dict):
            return None
        role = str(turn.get("from", turn.get("role", ""))).lower()
        text = turn.get("value", turn.get("content"))
        if not isinstance(text, str):
            continue
        if prompt is None and role in HUMAN_ROLES and text.strip():
            prompt = text
        elif prompt is not None and role in MODEL_ROLES:
            return prompt, text
    return None


def tokenizer_counter(folder: str) -> Callable[[str], int]:
    """Token counts by a local Hugging Face tokenizer folder (never downloaded)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    return lambda text: len(tokenizer(text, add_special_tokens=False).input_ids)
