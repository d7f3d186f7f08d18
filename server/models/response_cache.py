"""Triton's response cache (``--cache-config local,size=BYTES``): answers kept by request.

Why: a repeated request (same model, version and inputs) need not queue or compute again;
its answer is read back. As in Triton's ``local`` cache, one cache of ``size`` bytes is
shared by every model whose config enables it (``response_cache { enable: true }``); the
key is a hash of the model name, version and every input's name, datatype, shape and
bytes, so two requests with equal inputs hit. The requested output names are in the key
too (a Python model computes only the outputs asked for); a request that carries its own
parameters bypasses the cache (a Python model may read them). Only successful answers are
stored, least recently used entries leave first once the bytes would exceed ``size``, and
an answer larger than the whole cache is not stored (Triton's "Failed to insert key").

The cache is read and written from the event loop and from engine threads (Python models'
BLS calls go through the same runtime), so every access holds one lock.
"""

from __future__ import annotations

import hashlib
import struct
import threading
from collections import OrderedDict
from collections.abc import Mapping

import numpy as np

CACHE_KINDS = ("local",)  # Triton's other, redis, needs a Redis server: not implemented
# an entry's bookkeeping beyond its tensors' bytes, counted against the size (dict slot,
# key, arrays' headers): so that a cache of many tiny answers stays bounded too
ENTRY_OVERHEAD = 256


def decoupled_cache_refusal(name: str, source: str, why: str = "") -> str:
    """Triton's words for a response cache on a decoupled model; an ensemble is decoupled when
    one of its steps' models is (Triton marks it so when it checks the graph)."""
    return (f"{source}: Response Cache does not currently support model '{name}' with 'decoupled' "
            f"transaction policy{why}. Please disable the response cache.")  # fmt: skip


def parse_cache_config(text: str) -> int:
    """``local,size=BYTES`` (Triton's ``--cache-config``) -> the size in bytes (> 0). The flag
    may be repeated, one setting each time, as Triton's (``redis,host=H`` then ``redis,port=P``):
    the repeats arrive joined by ";" and merge when they name the same cache.

    Raises ValueError naming what is wrong: two caches (Triton's "found multiple cache
    configurations"), another cache kind, a missing or bad size, or an unknown key."""
    entries = [e.strip().partition(",") for e in text.split(";") if e.strip()]
    kinds = list(dict.fromkeys(kind.strip() for kind, _, _ in entries)) or [""]
    if len(kinds) > 1:
        raise ValueError(f"cache_config {text!r}: found multiple cache configurations ({', '.join(kinds)}), "
                         "but only a single cache is currently supported")  # fmt: skip
    kind, rest = kinds[0], ",".join(rest for _, _, rest in entries)
    if kind not in CACHE_KINDS:
        raise ValueError(f"cache_config {text!r}: cache {kind!r} is not implemented by wattserve "
                         f"(implemented: {', '.join(CACHE_KINDS)}; e.g. 'local,size=1048576')")  # fmt: skip
    size: int | None = None
    for pair in filter(None, (p.strip() for p in rest.split(","))):
        key, sep, value = pair.partition("=")
        if not sep or key.strip() != "size":
            raise ValueError(f"cache_config {text!r}: the local cache takes only size=BYTES, not {pair!r}")
        try:
            size = int(value.strip())
        except ValueError:
            raise ValueError(
                f"cache_config {text!r}: size {value.strip()!r} is not a whole number of bytes"
            ) from None
    if size is None or size <= 0:
        raise ValueError(f"cache_config {text!r}: the local cache needs size=BYTES above 0")
    return size


def _tensor_bytes(array: np.ndarray) -> bytes:
    """An input's bytes for the key: its raw buffer, or for BYTES (object) tensors each
    element length-prefixed, so [b"ab", b"c"] and [b"a", b"bc"] differ."""
    if array.dtype != object:
        return np.ascontiguousarray(array).tobytes()
    parts = []
    for element in array.reshape(-1):
        data = element if isinstance(element, bytes) else str(element).encode()
        parts.append(struct.pack("<Q", len(data)))
        parts.append(data)
    return b"".join(parts)


def request_key(
    model: str, version: str, inputs: Mapping[str, np.ndarray], outputs: list[str] | None
) -> bytes:
    """The cache key of one request: blake2b over the model, version, every input's name,
    datatype, shape and bytes (in name order), and the requested output names."""
    h = hashlib.blake2b(digest_size=16)
    for text in (model, version):
        h.update(struct.pack("<Q", len(text)))
        h.update(text.encode())
    for name in sorted(inputs):
        array = inputs[name]
        header = f"{name}\0{array.dtype.str}\0{','.join(map(str, array.shape))}".encode()
        data = _tensor_bytes(array)
        h.update(struct.pack("<QQ", len(header), len(data)))
        h.update(header)
        h.update(data)
    h.update(b"\0outputs:" + ("*" if outputs is None else "\0".join(sorted(outputs))).encode())
    return h.digest()


def _nbytes(outputs: Mapping[str, np.ndarray]) -> int:
    total = ENTRY_OVERHEAD
    for name, array in outputs.items():
        total += len(name) + array.nbytes
        if array.dtype == object:
            total += sum(len(e) if isinstance(e, bytes | str) else 8 for e in array.reshape(-1))
    return total


class ResponseCache:
    """An LRU map key -> one answer's output tensors, bounded by ``size`` bytes."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.used = 0
        self.evictions = 0
        self._entries: OrderedDict[bytes, tuple[dict[str, np.ndarray], int]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: bytes) -> dict[str, np.ndarray] | None:
        """The stored outputs (read-only arrays, shared by every hit), now the most recently used."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry[0]

    def put(self, key: bytes, outputs: Mapping[str, np.ndarray]) -> bool:
        """Store a copy of one successful answer's outputs, evicting the least recently used
        entries to fit; False (nothing stored) when it alone exceeds the cache."""
        stored = {}
        for name, array in outputs.items():
            copy = np.array(array, copy=True)  # a request's rows may be a view of its batch
            copy.flags.writeable = False
            stored[name] = copy
        cost = _nbytes(stored) + len(key)
        if cost > self.size:
            return False
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.used -= old[1]
            while self.used + cost > self.size and self._entries:
                _, (_, freed) = self._entries.popitem(last=False)
                self.used -= freed
                self.evictions += 1
            self._entries[key] = (stored, cost)
            self.used += cost
        return True
