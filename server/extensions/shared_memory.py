"""Triton's shared-memory extensions: regions a client registers by name, then names in
an inference request instead of sending tensor bytes.

System shared memory is a POSIX object (``shm_open(key)``, i.e. ``/dev/shm/<key>`` on
Linux) that this server maps with ``mmap``; CUDA shared memory is device memory exported by
the client as a CUDA IPC handle, opened through a ``CudaIpc`` backend (``server.extensions.cuda_ipc``).
One ``SharedMemoryRegistry`` per app, closed at shutdown. Messages, and which error kind
each refusal is, follow Triton's ``src/shared_memory_manager.cc`` and ``http_server.cc``.

Inputs are copied out of a region when the request is decoded, so a region unregistered
while a request is queued does not affect it; outputs are written after the request is
computed, into the region as it is registered then (Triton instead delays the unregister
until the request is answered). A client must not change a region while its request is in
flight, as with Triton.
"""

from __future__ import annotations

import mmap
import os
import stat
import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from wattserve.server.extensions.errors import ExtensionError

SHM_DIR = "/dev/shm"  # where glibc's shm_open puts POSIX shared memory objects
RESERVED_PREFIX = "triton_python_backend_shm_region_"  # Triton refuses keys with it (qa test)
CLIENT_SHM_DISABLED = (
    "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable."
)


class ShmError(ExtensionError):
    """A refused shared-memory call: Triton's message and error kind."""


class CudaUnavailable(Exception):
    """This server cannot open CUDA IPC handles (no cuda-python, no GPU)."""


class CudaMapping(Protocol):
    """An opened CUDA IPC allocation: bytes in and out of device memory."""

    def read(self, offset: int, size: int) -> bytes: ...
    def write(self, offset: int, data: bytes | memoryview) -> None: ...
    def close(self) -> None: ...


class CudaIpc(Protocol):
    """Opens a client's ``cudaIpcMemHandle_t`` (64 raw bytes) on ``device_id``."""

    def open(self, raw_handle: bytes, device_id: int, byte_size: int) -> CudaMapping: ...


@dataclass
class Region:
    name: str
    kind: str  # "system" or "cuda"
    byte_size: int
    key: str = ""  # system: the shm key as registered
    offset: int = 0  # system: where the region starts in the object
    device_id: int = 0  # cuda
    memory: mmap.mmap | None = None  # system: the whole object, mapped
    cuda: CudaMapping | None = None

    def status(self) -> dict[str, Any]:
        if self.kind == "system":
            return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}
        return {"name": self.name, "device_id": self.device_id, "byte_size": self.byte_size}

    def read(self, offset: int, size: int) -> bytes:
        if self.memory is not None:
            start = self.offset + offset
            return self.memory[start : start + size]  # a copy: the request owns its input
        assert self.cuda is not None
        return self.cuda.read(offset, size)

    def write(self, offset: int, data: bytes | memoryview) -> None:
        if self.memory is not None:
            start = self.offset + offset
            self.memory[start : start + len(data)] = data
            return
        assert self.cuda is not None
        self.cuda.write(offset, data)

    def close(self) -> None:
        if self.memory is not None:
            self.memory.close()
        if self.cuda is not None:
            self.cuda.close()


class SharedMemoryRegistry:
    """The regions registered with one server, by name (system and CUDA share names)."""

    def __init__(self, allow_client_shm: bool = True, cuda: CudaIpc | None = None) -> None:
        self.allow = allow_client_shm
        self.cuda = cuda  # None: this server cannot open CUDA IPC handles
        self._regions: dict[str, Region] = {}
        self._lock = threading.Lock()  # decoding may run on worker threads (large bodies)

    # ------------------------------------------------------------------ register / unregister
    def register_system(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self.check_allowed()
        if not name:
            raise ShmError("'region name' is necessary to register system shared memory region")
        _check_uint("offset", offset)
        _check_uint("byte_size", byte_size)
        _check_key(name, key)
        with self._lock:
            if name in self._regions:
                raise ShmError(f"shared memory region '{name}' already in manager", "exists")
            memory = _map_object(name, key, offset, byte_size)
            self._regions[name] = Region(name, "system", byte_size, key=key, offset=offset, memory=memory)

    def register_cuda(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        self.check_allowed()
        if not name:
            raise ShmError("'region name' is necessary to register cuda shared memory region")
        _check_uint("device_id", device_id)
        _check_uint("byte_size", byte_size)
        if self.cuda is None:  # Triton built without GPU support answers the same
            raise ShmError(f"failed to register CUDA shared memory region: '{name}', GPUs not supported")
        if len(raw_handle) != 64:  # sizeof(cudaIpcMemHandle_t)
            raise ShmError("'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t")
        with self._lock:
            if name in self._regions:
                raise ShmError(f"shared memory region '{name}' already in manager", "exists")
            try:
                mapping = self.cuda.open(raw_handle, device_id, byte_size)
            except ShmError:
                raise
            except CudaUnavailable:
                raise ShmError(
                    f"failed to register CUDA shared memory region: '{name}', GPUs not supported"
                ) from None
            except Exception as exc:  # the driver refused the handle: the client's handle is bad
                raise ShmError(
                    f"failed to register shared memory region '{name}': invalid args ({exc})"
                ) from None
            self._regions[name] = Region(name, "cuda", byte_size, device_id=device_id, cuda=mapping)

    def unregister(self, name: str, kind: str) -> None:
        """Triton: an unknown name (or one of the other kind) is not an error."""
        self.check_allowed()
        with self._lock:
            region = self._regions.get(name)
            if region is not None and region.kind == kind:
                del self._regions[name]
                region.close()

    def unregister_all(self, kind: str) -> None:
        self.check_allowed()
        with self._lock:
            for name in [n for n, r in self._regions.items() if r.kind == kind]:
                self._regions.pop(name).close()

    def status(self, kind: str, name: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            if not name:
                return [r.status() for r in self._regions.values() if r.kind == kind]
            region = self._regions.get(name)
        label = "system" if kind == "system" else "cuda"
        if region is None:
            raise ShmError(f"Unable to find {label} shared memory region: '{name}'", "not_found")
        if region.kind != kind:
            other, this = ("CUDA", "system") if region.kind == "cuda" else ("system", "CUDA")
            raise ShmError(
                f"The region named '{name}' is registered as {other} shared memory, not {this} shared memory",
                "not_found",
            )
        return [region.status()]

    def close(self) -> None:
        """Server shutdown: unmap everything (the client's objects stay; they are theirs)."""
        with self._lock:
            for region in self._regions.values():
                region.close()
            self._regions.clear()

    # ------------------------------------------------------------------ data
    def region(self, name: str, offset: int, byte_size: int) -> Region:
        """The region ``name``, with ``offset``..``offset + byte_size`` inside it
        (Triton's GetMemoryInfo checks and messages)."""
        region = self._regions.get(name)
        if region is None:
            raise ShmError(f"Unable to find shared memory region: '{name}'", "not_found")
        if offset >= region.byte_size:
            raise ShmError(f"Invalid offset for shared memory region: '{name}'")
        if offset + byte_size > region.byte_size:
            raise ShmError(f"Invalid offset + byte size for shared memory region: '{name}'")
        return region

    def read(self, name: str, offset: int, byte_size: int) -> bytes:
        with self._lock:
            return self.region(name, offset, byte_size).read(offset, byte_size)

    def write(self, name: str, offset: int, data: bytes | memoryview) -> None:
        with self._lock:
            self.region(name, offset, len(data)).write(offset, data)

    def check_allowed(self) -> None:
        if not self.allow:
            raise ShmError(CLIENT_SHM_DISABLED, "unsupported")


def _check_uint(field: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ShmError(f"Unable to parse '{field}': expected a non-negative integer, got {value!r}")


def _check_key(name: str, key: Any) -> None:
    """Triton's key checks, plus: a key names one object in /dev/shm, never a path."""
    if not isinstance(key, str):
        raise ShmError(f"Unable to parse 'key': expected a string, got {key!r}")
    bare = key.lstrip("/")
    if bare.startswith(RESERVED_PREFIX):
        raise ShmError(
            f"cannot register shared memory region '{name}' with key '{key}' as the key contains "
            f"the reserved prefix '{RESERVED_PREFIX}'"
        )
    if not bare:
        raise ShmError(f"cannot register shared memory region '{name}' - invalid shm key '{key}'")
    if "/" in bare or bare in (".", "..") or "\0" in bare:  # shm_open refuses these too
        raise ShmError(f"Unable to open shared memory region: '{key}'")


def _map_object(name: str, key: str, offset: int, byte_size: int) -> mmap.mmap:
    """Open and map the POSIX object ``key``, checking that the region lies inside it."""
    path = os.path.join(SHM_DIR, key.lstrip("/"))
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        raise ShmError(f"Unable to open shared memory region: '{key}'") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ShmError(f"Invalid shared memory region: '{key}'")
        if offset + byte_size > info.st_size or info.st_size == 0:
            raise ShmError(f"failed to register shared memory region '{name}': invalid args")
        try:
            return mmap.mmap(fd, info.st_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except (OSError, ValueError) as exc:
            raise ShmError(f"failed to register shared memory region '{name}': {exc}") from None
    finally:
        os.close(fd)


# ---------------------------------------------------------------- inference (codec call sites)
# Tensors named in a request's ``parameters``: ``shared_memory_region`` (str),
# ``shared_memory_byte_size`` (int) and the optional ``shared_memory_offset`` (int, 0).


def tensor_region(tensor: str, params: dict[str, Any]) -> tuple[str, int, int] | None:
    """(region, offset, byte_size) from an input's or output's parameters; None without
    ``shared_memory_region``. Types are checked as Triton's gRPC front end checks them."""
    region = params.get("shared_memory_region")
    if region is None:
        for field in ("shared_memory_offset", "shared_memory_byte_size"):
            if field in params:
                raise ShmError(
                    f"'{field}' can not be specified without 'shared_memory_region' parameter "
                    f"for tensor '{tensor}'"
                )
        return None
    if not isinstance(region, str):
        raise ShmError(f"invalid value type for 'shared_memory_region' parameter for tensor '{tensor}', "
                       "expected string_param.")  # fmt: skip
    values = []
    for field, default in (("shared_memory_offset", 0), ("shared_memory_byte_size", None)):
        value = params.get(field, default)
        if value is None:
            raise ShmError(f"'{field}' is required with 'shared_memory_region' for tensor '{tensor}'")
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ShmError(f"invalid value for '{field}' parameter for tensor '{tensor}', "
                           f"expected a non-negative integer, got {value!r}")  # fmt: skip
        values.append(value)
    return region, values[0], values[1]


def read_input(
    shm: SharedMemoryRegistry | None, tensor: str, raw: dict[str, Any], params: dict[str, Any]
) -> bytes:
    """An HTTP/JSON input's bytes from its region (``raw``: the input's JSON object)."""
    if "data" in raw or "binary_data_size" in params:
        given = " 'data'" if "data" in raw else " 'binary_data_size'"
        raise ShmError(
            "Input must set only one of the following fields: 'data', 'binary_data_size' in "
            f"'parameters', 'shared_memory_region' in 'parameters'. But set{given} 'shared_memory_region'"
        )
    return read_region(shm, tensor, params)


def read_region(shm: SharedMemoryRegistry | None, tensor: str, params: dict[str, Any]) -> bytes:
    where = tensor_region(tensor, params)
    assert where is not None
    if shm is None:
        raise ShmError("this server does not take shared-memory tensors", "unsupported")
    return shm.read(*where)


def check_output_regions(shm: SharedMemoryRegistry | None, regions: dict[str, tuple[str, int, int]]) -> None:
    """Before the request is queued: every output's region exists and holds its range."""
    if regions and shm is None:
        raise ShmError("this server does not take shared-memory tensors", "unsupported")
    for where in regions.values():
        assert shm is not None
        shm.region(*where)


def output_region(tensor: str, params: dict[str, Any]) -> tuple[str, int, int] | None:
    """An output's region from its parameters; shared memory excludes binary_data and
    classification (Triton's ValidateOutputParameter)."""
    where = tensor_region(tensor, params)
    if where is not None:
        if params.get("binary_data") is True:
            raise ShmError("Output can't set both 'shared_memory_region' and 'binary_data'")
        if "classification" in params:
            raise ShmError("Output can't set both 'shared_memory_region' and 'classification'")
    return where


def write_outputs(
    shm: SharedMemoryRegistry | None,
    regions: dict[str, tuple[str, int, int]],
    arrays: Sequence[tuple[str, str, np.ndarray]],
) -> set[str]:
    """Write each output that has a region into it; return their names (the response
    carries their name, datatype and shape, and no data, as Triton's does)."""
    written: set[str] = set()
    for name, _datatype, value in arrays:
        where = regions.get(name)
        if where is None:
            continue
        region, offset, byte_size = where
        data = _tensor_bytes(value)
        if len(data) > byte_size:
            raise ShmError(
                f"shared memory size specified with the request for output '{name}' ({byte_size} bytes) "
                f"should be at least {len(data)} bytes to hold the results"
            )
        if shm is None:
            raise ShmError("this server does not take shared-memory tensors", "unsupported")
        shm.write(region, offset, data)
        written.add(name)
    return written


def _tensor_bytes(value: np.ndarray) -> bytes | memoryview:
    """Raw bytes as Triton lays them out: little-endian numbers; BYTES elements each
    prefixed with their 4-byte length."""
    if value.dtype.kind == "O":
        return b"".join(struct.pack("<I", len(e)) + bytes(e) for e in value.ravel())
    return memoryview(np.ascontiguousarray(value).data).cast("B")
