"""Triton's rate limiter: an instance runs a batch only when the resources it names are free.

One ``RateLimiter`` per server (``server/app.py``), shared by every model's instances. With
``--rate-limit execution_count`` each instance group's ``rate_limiter { resources [...]
priority }`` becomes a ``Claim``: the batcher takes its resources before a batch runs and
gives them back once it has run (``batchers.base.RequestBatcher``). A resource is per device
(the instance's GPU; CPU instances count as device 0, as in Triton) unless ``global``; its
pool is what ``--rate-limit-resource name:count[:device]`` sets (with any flag set, a resource
no flag names has none), else the most any instance asks. When several instances wait, the one with the lowest
``runs x priority`` goes first (Triton's ``ScaledPriority``: priority 2 gets half the chances
of priority 1; 0 counts as 1), ties in arrival order; the head waits for its resources, so a
big claim is not starved by small ones. With ``off`` (Triton's default) resources are ignored.

Everything here runs on the event loop: waiting is a future, never a blocked thread.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

GLOBAL = "global"  # the device key of a global resource
Key = int | str  # a per-device pool's GPU index (CPU instances: 0), or GLOBAL
MODES = ("off", "execution_count")


@dataclass(frozen=True)
class Resource:
    """One resource an instance group's rate limiter names (Triton's ``Resource``)."""

    name: str
    count: int
    is_global: bool = False


@dataclass(frozen=True)
class InstanceLimits:
    """An instance group's ``rate_limiter``: what each of its instances needs to run."""

    resources: tuple[Resource, ...] = ()
    priority: int = 0

    def describe(self) -> str:
        """For logs: ``R1:2 (global), priority 1``."""
        named = ", ".join(f"{r.name}:{r.count}{' (global)' if r.is_global else ''}" for r in self.resources)
        return f"{named}, priority {self.priority}"


@dataclass(eq=False)
class Claim:
    """One instance's standing request: resources by (name, device key), its priority, its runs."""

    needs: dict[tuple[str, Key], int]
    priority: int
    owner: str
    runs: int = 0

    def scaled(self) -> int:
        return self.runs * max(1, self.priority)


@dataclass(order=True)
class _Waiter:
    rank: tuple[int, int]
    claim: Claim = field(compare=False)
    future: asyncio.Future[None] = field(compare=False)


def parse_resource_flag(text: str) -> tuple[str, int, int | None]:
    """``name:count[:device]`` (Triton's ``--rate-limit-resource``) -> (name, count, device)."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or not parts[0] or not parts[1].isdigit():
        raise ValueError(f"--rate-limit-resource {text!r}: expected <name>:<count>[:<device>]")
    if len(parts) == 3 and not parts[2].isdigit():
        raise ValueError(f"--rate-limit-resource {text!r}: the device is a GPU index")
    return parts[0], int(parts[1]), int(parts[2]) if len(parts) == 3 else None


def device_key(device: str) -> int:
    """The device whose pool a per-device resource is counted in, as Triton numbers it: GPU N
    is N; a CPU instance is device 0 (Triton gives KIND_CPU instances device id 0)."""
    kind, _, index = device.partition(":")
    return int(index) if kind == "cuda" and index.isdigit() else 0


class RateLimiter:
    """The server's resource pools and the instances waiting for them (event loop only)."""

    def __init__(self, mode: str = "off", resources: Sequence[str] = ()) -> None:
        if mode not in MODES:
            raise ValueError(f"--rate-limit {mode!r}: expected one of {', '.join(MODES)}")
        self.enabled = mode == "execution_count"
        # the flag's counts by (name, device); device None: every device
        self._set: dict[tuple[str, int | None], int] = {}
        for text in resources:
            name, count, device = parse_resource_flag(text)
            self._set[(name, device)] = count
        self.pools: dict[tuple[str, Key], int] = {}
        self.free: dict[tuple[str, Key], int] = {}
        self._waiting: list[_Waiter] = []
        self._order = itertools.count()
        self._claims: list[Claim] = []  # every loaded instance's, for the pools' maxima

    def claim(self, limits: InstanceLimits | None, device: str, owner: str) -> Claim | None:
        """An instance on ``device`` with these ``limits`` joins; its claim (None: it is never
        limited: rate limiting is off, or it names no resource). Refused (ValueError, the
        load fails) as Triton refuses it: a resource both global and per device, or one the
        flags make too scarce for it (with any flag set, a resource it omits has none)."""
        if not self.enabled or limits is None or not limits.resources:
            return None
        needs: dict[tuple[str, Key], int] = {}
        for res in limits.resources:  # a name repeated in one group: the last (Triton's map)
            needs[(res.name, GLOBAL if res.is_global else device_key(device))] = res.count
        for name, where in needs:
            other = [
                k for k in [*self.pools, *needs] if k[0] == name and (k[1] == GLOBAL) != (where == GLOBAL)
            ]
            if other:
                raise ValueError(f'Resource "{name}" is present as both global and device-specific '
                                 "resource in the model configuration.")  # fmt: skip
        for key, count in needs.items():
            fixed = self._fixed(key)
            if fixed is not None and count > fixed:
                raise ValueError(f'Resource count for "{key[0]}" is limited to {fixed} which will prevent '
                                 "scheduling of one or more model instances, the minimum required count "
                                 f"is {count}")  # fmt: skip
        for key, count in needs.items():
            fixed = self._fixed(key)
            pool = fixed if fixed is not None else max(self.pools.get(key, 0), count)
            self.free[key] = self.free.get(key, 0) + pool - self.pools.get(key, 0)
            self.pools[key] = pool
        claim = Claim(needs, limits.priority, owner)
        self._claims.append(claim)
        return claim

    def withdraw(self, claims: Sequence[Claim | None]) -> None:
        """Unloaded (or failed to load) instances leave: each pool they sized is the most
        the remaining instances ask again (Triton recomputes it on removal too)."""
        gone = [c for c in claims if c is not None]
        self._claims = [c for c in self._claims if all(c is not g for g in gone)]
        for key in {k for c in gone for k in c.needs}:
            asked = [c.needs[key] for c in self._claims if key in c.needs]
            if not asked:
                self.pools.pop(key, None)
                self.free.pop(key, None)
                continue
            fixed = self._fixed(key)
            pool = fixed if fixed is not None else max(asked)
            self.free[key] += pool - self.pools[key]
            self.pools[key] = pool
        self._grant()

    def _fixed(self, key: tuple[str, Key]) -> int | None:
        """The flags' count for a resource (Triton: the most any matching flag gives; a global
        resource matches a flag of any device); None when no flag is set at all."""
        if not self._set:
            return None
        name, where = key
        return max((count for (n, device), count in self._set.items()
                    if n == name and (where == GLOBAL or device in (None, where))), default=0)  # fmt: skip

    def try_acquire(self, claim: Claim) -> bool:
        """Take the claim's resources now if nobody waits ahead and they are free."""
        if self._waiting or not self._fits(claim):
            return False
        self._take(claim)
        return True

    async def acquire(self, claim: Claim) -> None:
        """Wait (on the loop) for the claim's turn and resources, then hold them."""
        if self.try_acquire(claim):
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, _Waiter((claim.scaled(), next(self._order)), claim, future))
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():  # granted as we were cancelled: give back
                self.release(claim)
            else:
                self._grant()  # a cancelled head no longer blocks those behind it
            raise

    def release(self, claim: Claim) -> None:
        """A batch has run: its resources go back, and waiting instances get their turn."""
        for key, count in claim.needs.items():
            self.free[key] += count
        self._grant()

    def _fits(self, claim: Claim) -> bool:
        return all(self.free[key] >= count for key, count in claim.needs.items())

    def _take(self, claim: Claim) -> None:
        for key, count in claim.needs.items():
            self.free[key] -= count
        claim.runs += 1

    def _grant(self) -> None:
        while self._waiting:
            head = self._waiting[0]
            if head.future.done():  # its waiter was cancelled
                heapq.heappop(self._waiting)
                continue
            if not self._fits(head.claim):
                return
            heapq.heappop(self._waiting)
            self._take(head.claim)
            head.future.set_result(None)

    @property
    def waiting(self) -> int:
        return sum(1 for w in self._waiting if not w.future.done())
