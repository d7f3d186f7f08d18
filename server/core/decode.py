"""Decoding an inference request, the same for every front end.

A front end gives two things: how to *read* its request (HTTP: the body within its limits;
gRPC: the message it already holds), reserving the payload's bytes in the shared
``BodyBudget``, and how to *parse* that payload against the model's tensor specs
(``server.http.codec.parse_infer_request``, ``server.grpc.codec.parse_grpc_request``).
``InferenceDecoder`` does the rest once: refuse a model being unloaded, parse on a worker
thread past ``OFFLOAD_DECODE_BYTES``, release the reservation, and hand back the engine the
request was decoded for.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, Protocol, TypeVar

from wattserve.batchers.status import Status
from wattserve.engines.base import Engine, TensorSpec
from wattserve.server.core.admission import Refused
from wattserve.server.core.request import BadRequest, InferRequest, UnknownOutput
from wattserve.server.extensions.shared_memory import SharedMemoryRegistry
from wattserve.server.models.runtime import ModelRuntime

OFFLOAD_DECODE_BYTES = 256 * 1024  # payloads above this are parsed on a worker thread


class BodyBudget:
    """Request-body bytes being read or parsed at once, over all requests and protocols.

    A request reserves its declared length (or, chunked, each chunk as it arrives) and
    releases it once parsed; past the budget new requests are refused (UNAVAILABLE) before
    their body is read."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def try_reserve(self, n: int) -> bool:
        if self.used + n > self.limit:
            return False
        self.used += n
        return True

    def reserve(self, n: int) -> None:
        """Reserve ``n`` bytes or raise BudgetExceeded."""
        if not self.try_reserve(n):
            raise BudgetExceeded()

    def release(self, n: int) -> None:
        self.used = max(0, self.used - n)


class BudgetExceeded(BadRequest):
    def __init__(self) -> None:
        super().__init__(
            "server is reading too many request bodies at once; retry shortly", Status.UNAVAILABLE
        )


P = TypeVar("P")  # a front end's payload: HTTP's (body, binary header length), gRPC's message
P_in = TypeVar("P_in", contravariant=True)

# (runtime, the front end's request) -> (its payload, the bytes of the body budget the read
# reserved (released once parsed), the payload's size (the offload decision)). gRPC reserves
# nothing here: its receive path already holds the message's worst-case decoding cost until
# the answer, and counting it twice refused requests the budget had room for.
Read = Callable[[ModelRuntime, Any], Awaitable[tuple[P, int, int]]]


class Parse(Protocol[P_in]):
    """A front end's payload -> the validated request, against the engine it is for."""

    def __call__(
        self,
        payload: P_in,
        specs: Sequence[TensorSpec],
        output_specs: Sequence[TensorSpec],
        max_batch_size: int,
        check_values: bool,
        shm: SharedMemoryRegistry | None,
        /,
    ) -> InferRequest: ...


class InferenceDecoder(Generic[P]):
    """The decoder (``server.core.admission.Decode``) of a front end's inference requests:
    its ``read`` and ``parse`` agree on the payload type ``P``."""

    __slots__ = ("budget", "parse", "read", "shm")

    def __init__(
        self, read: Read[P], parse: Parse[P], budget: BodyBudget, shm: SharedMemoryRegistry | None
    ) -> None:
        self.read = read
        self.parse = parse
        self.budget = budget
        self.shm = shm

    async def __call__(self, runtime: ModelRuntime, source: Any) -> tuple[InferRequest, Engine]:
        engine = runtime.engine
        if engine is None:
            raise Refused(f"model {runtime.name!r} is unloading", Status.UNAVAILABLE, retry_after=True,
                          body_unread=True)  # fmt: skip
        payload, held, size = await self.read(runtime, source)
        try:
            args = (payload, engine.inputs, engine.outputs, runtime.request_max_batch,
                    runtime.serving.check_values, self.shm)  # fmt: skip
            if size > OFFLOAD_DECODE_BYTES:
                return await asyncio.to_thread(self.parse, *args), engine
            return self.parse(*args), engine
        except UnknownOutput as unknown:  # Triton's words, which name the model
            raise unknown.for_model(runtime.name) from None
        finally:
            self.budget.release(held)
