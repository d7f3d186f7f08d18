"""Batch-size planning shared by every engine that is built for particular batch sizes.

TensorRT engines are built with optimization profiles (min/opt/max batch each); CUDA graphs
are captured for a few batch buckets. Both can only run batches of the sizes they were built
for, so a batch of another size is padded up and its outputs sliced back. This module is the
pure logic of that (no GPU, no TensorRT), so it can be tested anywhere.
"""

from __future__ import annotations

import bisect
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True, order=True)
class BatchProfile:
    """One TensorRT optimization profile over the batch axis: min <= opt <= max."""

    min: int
    opt: int
    max: int

    def __post_init__(self) -> None:
        if not 1 <= self.min <= self.opt <= self.max:
            raise ValueError(f"profile {self} must satisfy 1 <= min <= opt <= max")

    def contains(self, batch_size: int) -> bool:
        return self.min <= batch_size <= self.max

    def __str__(self) -> str:
        return f"{self.min}:{self.opt}:{self.max}"


def parse_profiles(text: str) -> list[BatchProfile]:
    """Parse "1:1:1,2:4:8,8:16:32" into profiles, in the order given.

    The order matters: it is the profile index TensorRT numbers them by. Duplicates are
    rejected because two identical profiles only cost build time and memory.
    """
    profiles: list[BatchProfile] = []
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        fields = part.split(":")
        if len(fields) != 3:
            raise ValueError(f"profile {part!r} is not min:opt:max")
        try:
            lo, opt, hi = (int(f) for f in fields)
        except ValueError as exc:
            raise ValueError(f"profile {part!r} has a non-integer batch size") from exc
        profiles.append(BatchProfile(lo, opt, hi))
    if not profiles:
        raise ValueError("no optimization profiles given")
    if len(set(profiles)) != len(profiles):
        raise ValueError(f"duplicate optimization profiles in {text!r}")
    return profiles


def format_profiles(profiles: Sequence[BatchProfile]) -> str:
    return ",".join(str(p) for p in profiles)


def profiles_max_batch(profiles: Sequence[BatchProfile]) -> int:
    return max(p.max for p in profiles)


def profiles_opt_sizes(profiles: Sequence[BatchProfile]) -> list[int]:
    """The sizes the profiles were tuned for: what a batcher should aim to form."""
    return sorted({p.opt for p in profiles})


def select_profile(batch_size: int, profiles: Sequence[BatchProfile]) -> tuple[int, int]:
    """Pick the profile that runs a batch, and the (padded) size it runs at.

    Returns ``(profile_index, run_size)``. Among profiles whose range holds the batch, the
    narrowest wins (its kernels were chosen for sizes nearest this one), then the one whose
    opt is closest, then the lower index. A batch in a gap between profiles is padded up to
    the smallest ``min`` above it. A batch above every profile's max is an error.
    """
    if batch_size < 1:
        raise ValueError(f"batch size must be >= 1, got {batch_size}")
    holding = [i for i, p in enumerate(profiles) if p.contains(batch_size)]
    if holding:
        best = min(
            holding,
            key=lambda i: (
                profiles[i].max - profiles[i].min,
                abs(profiles[i].opt - batch_size),
                i,
            ),
        )
        return best, batch_size
    above = [i for i, p in enumerate(profiles) if p.min > batch_size]
    if not above:
        raise ValueError(
            f"batch size {batch_size} exceeds every profile's max "
            f"({profiles_max_batch(profiles)}) in {format_profiles(profiles)}"
        )
    best = min(above, key=lambda i: (profiles[i].min, profiles[i].max - profiles[i].min, i))
    return best, profiles[best].min


def normalize_buckets(buckets: Iterable[int]) -> list[int]:
    """Sorted unique positive bucket sizes; an empty list is an error."""
    out = sorted({int(b) for b in buckets})
    if not out:
        raise ValueError("no batch buckets given")
    if out[0] < 1:
        raise ValueError(f"batch buckets must be >= 1, got {out}")
    return out


def default_buckets(max_batch_size: int) -> list[int]:
    """Powers of two up to max_batch_size, plus max_batch_size itself (1, 2, 4, ..., max)."""
    if max_batch_size < 1:
        raise ValueError("max_batch_size must be >= 1")
    out = []
    size = 1
    while size < max_batch_size:
        out.append(size)
        size *= 2
    out.append(max_batch_size)
    return out


def choose_bucket(batch_size: int, buckets: Sequence[int]) -> int:
    """The smallest bucket that holds ``batch_size`` (``buckets`` sorted ascending)."""
    if batch_size < 1:
        raise ValueError(f"batch size must be >= 1, got {batch_size}")
    i = bisect.bisect_left(buckets, batch_size)
    if i == len(buckets):
        raise ValueError(f"batch size {batch_size} exceeds the largest bucket {buckets[-1]}")
    return buckets[i]


def batch_length(batch: Mapping[str, np.ndarray]) -> int:
    """The common axis-0 length of every array in a batch; mismatches are an error."""
    lengths = {name: int(arr.shape[0]) for name, arr in batch.items()}
    if not lengths:
        raise ValueError("empty batch (no tensors)")
    distinct = set(lengths.values())
    if len(distinct) != 1:
        raise ValueError(f"tensors disagree on the batch size: {lengths}")
    return distinct.pop()


def pad_batch(batch: Mapping[str, np.ndarray], size: int) -> dict[str, np.ndarray]:
    """Pad every tensor on axis 0 up to ``size`` by repeating its last item.

    Repeating a real item (rather than zeros) keeps padded rows inside the input's valid
    domain for any model (token ids, masks, images); each row of a batch is computed
    independently, so padded rows never change the real rows' outputs.
    """
    n = batch_length(batch)
    if size < n:
        raise ValueError(f"cannot pad a batch of {n} down to {size}")
    if size == n:
        return dict(batch)
    out = {}
    for name, arr in batch.items():
        filler = np.repeat(arr[-1:], size - n, axis=0)
        out[name] = np.concatenate([arr, filler], axis=0)
    return out


def file_sha256(path: str | Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def plan_cache_key(
    *,
    onnx_sha256: str,
    gpu_name: str,
    trt_version: str,
    profiles: Sequence[BatchProfile],
    precision: str,
    extra: Mapping[str, str] | None = None,
) -> str:
    """A short stable key for a serialized TensorRT plan.

    A plan is only valid for the exact ONNX graph, GPU model and TensorRT version it was
    built with; profiles and precision change what it contains. Any change to one of them
    must miss the cache, so all of them (and ``extra``, e.g. compute capability) go in.
    """
    if precision not in ("fp32", "fp16"):
        raise ValueError(f"precision must be fp32 or fp16, got {precision!r}")
    fields = {
        "onnx_sha256": onnx_sha256,
        "gpu": gpu_name,
        "tensorrt": trt_version,
        "profiles": format_profiles(profiles),
        "precision": precision,
        **dict(extra or {}),
    }
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:24]


def plan_file_name(model: str, key: str) -> str:
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in model)
    return f"{safe}-{key}.plan"
