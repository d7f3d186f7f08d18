"""FakeCudaIpc: a TEST DOUBLE of the CUDA IPC backend (``server.extensions.cuda_ipc.CudaRuntimeIpc``).

This machine has no GPU, so CUDA shared memory is tested against simulated device memory:
``export`` plays the client's ``cudaMalloc`` + ``cudaIpcGetMemHandle`` and returns a
64-byte handle; ``open`` plays the server's ``cudaIpcOpenMemHandle``, refusing a handle it
never exported (as the driver refuses a bad one) and a size beyond the allocation (as the
``cuMemGetAddressRange`` check does). Never used outside tests.
"""

from __future__ import annotations

import os


class FakeCudaIpc:
    def __init__(self) -> None:
        self.memory: dict[bytes, tuple[bytearray, int]] = {}  # handle -> (device bytes, device id)
        self.open_count = 0

    def export(self, size: int, device_id: int = 0) -> tuple[bytes, bytearray]:
        handle = os.urandom(64)
        buffer = bytearray(size)
        self.memory[handle] = (buffer, device_id)
        return handle, buffer

    def open(self, raw_handle: bytes, device_id: int, byte_size: int) -> FakeMapping:
        if raw_handle not in self.memory:
            raise RuntimeError("CUDA error 400 (cudaErrorInvalidResourceHandle)")
        buffer, device = self.memory[raw_handle]
        if device != device_id:
            raise RuntimeError("CUDA error 101 (cudaErrorInvalidDevice)")
        if byte_size > len(buffer):
            raise ValueError(f"byte_size {byte_size} exceeds the allocation's {len(buffer)} bytes")
        self.open_count += 1
        return FakeMapping(self, buffer)


class FakeMapping:
    def __init__(self, owner: FakeCudaIpc, buffer: bytearray) -> None:
        self.owner = owner
        self.buffer = buffer
        self.closed = False

    def read(self, offset: int, size: int) -> bytes:
        assert not self.closed
        return bytes(self.buffer[offset : offset + size])

    def write(self, offset: int, data: bytes | memoryview) -> None:
        assert not self.closed
        self.buffer[offset : offset + len(data)] = data

    def close(self) -> None:
        self.closed = True
        self.owner.open_count -= 1
