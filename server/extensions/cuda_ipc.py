"""CUDA shared memory: open a client's CUDA IPC handle with cuda-python (``cuda.bindings``)
and copy bytes between it and host memory.

UNVERIFIED ON A GPU unless docs/ says otherwise: tests run this interface against a test
double (``support.doubles.fake_cuda_ipc``). It follows what Triton's shared_memory_manager
does: ``cudaIpcOpenMemHandle`` on the region's device, the registered size checked against
the allocation (``cuMemGetAddressRange``), ``cudaIpcCloseMemHandle`` on unregister. A
handle cannot be opened in the process that exported it (CUDA's rule), so a client and
this server must be different processes.
"""

from __future__ import annotations

import ctypes
import importlib
from typing import Any

from wattserve.server.extensions.shared_memory import CudaUnavailable

IPC_HANDLE_SIZE = 64  # sizeof(cudaIpcMemHandle_t)


def _check(result: Any) -> Any:
    """cuda-python returns (error, *values); raise on an error, return the value(s)."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise RuntimeError(f"CUDA error {int(err)} ({getattr(err, 'name', err)})")
    return values[0] if len(values) == 1 else values


class CudaRuntimeIpc:
    """The real backend: CUDA runtime through cuda-python, imported on first use."""

    def __init__(self) -> None:
        self._rt: Any = None
        self._drv: Any = None

    def _load(self) -> None:
        if self._rt is not None:
            return
        try:
            self._rt = importlib.import_module("cuda.bindings.runtime")
            self._drv = importlib.import_module("cuda.bindings.driver")
        except ImportError:
            raise CudaUnavailable("cuda-python is not installed") from None
        err, count = self._rt.cudaGetDeviceCount()
        if int(err) != 0 or count == 0:
            self._rt = None
            raise CudaUnavailable("no CUDA device")

    def open(self, raw_handle: bytes, device_id: int, byte_size: int) -> CudaIpcMapping:
        self._load()
        rt = self._rt
        handle = rt.cudaIpcMemHandle_t()
        ctypes.memmove(handle.getPtr(), raw_handle, IPC_HANDLE_SIZE)
        _check(rt.cudaSetDevice(device_id))
        pointer = int(_check(rt.cudaIpcOpenMemHandle(handle, rt.cudaIpcMemLazyEnablePeerAccess)))
        mapping = CudaIpcMapping(rt, pointer, device_id)
        try:
            _base, size = _check(self._drv.cuMemGetAddressRange(pointer))
            if byte_size > int(size):
                raise ValueError(f"byte_size {byte_size} exceeds the allocation's {int(size)} bytes")
        except BaseException:
            mapping.close()
            raise
        return mapping


class CudaIpcMapping:
    """One opened handle: device pointer, copies in and out (synchronous)."""

    def __init__(self, rt: Any, pointer: int, device_id: int) -> None:
        self.rt = rt
        self.pointer = pointer
        self.device_id = device_id

    def read(self, offset: int, size: int) -> bytes:
        host = (ctypes.c_char * size)()
        _check(self.rt.cudaSetDevice(self.device_id))  # the current device is per thread
        kind = self.rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        _check(self.rt.cudaMemcpy(ctypes.addressof(host), self.pointer + offset, size, kind))
        return bytes(host)

    def write(self, offset: int, data: bytes | memoryview) -> None:
        host = (ctypes.c_char * len(data)).from_buffer_copy(data)
        _check(self.rt.cudaSetDevice(self.device_id))
        kind = self.rt.cudaMemcpyKind.cudaMemcpyHostToDevice
        _check(self.rt.cudaMemcpy(self.pointer + offset, ctypes.addressof(host), len(data), kind))

    def close(self) -> None:
        if self.pointer:
            _check(self.rt.cudaSetDevice(self.device_id))
            _check(self.rt.cudaIpcCloseMemHandle(self.pointer))
            self.pointer = 0
