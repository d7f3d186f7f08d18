"""The models one server serves: lookup, readiness with its reason, load, unload, drain.

The front ends look models up here (admission, metadata, repository routes) and submit to
the ``ModelRuntime`` they get. Each model version has its own ``ModelRuntime``
(batcher, queue, engine instances, threads); a model that fails to load is kept here as
UNAVAILABLE with the reason, and the others serve (``strict``: the failure is fatal, like
Triton's ``--exit-on-error``).

Triton's model control modes decide what loads at start and who may change it afterwards:
``none`` (Triton's default) loads everything and refuses load/unload requests; ``explicit``
loads only the ``startup`` names ("*": all) and obeys clients; ``poll`` loads everything and
lets only the repository poller (``server.models.repository.poll``) change the set.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from wattserve.server.lifecycle import freeze_heap
from wattserve.server.models.plan import ModelPlan, ModelSource
from wattserve.server.models.runtime import ModelRuntime

log = logging.getLogger("wattserve.models")


class ModelState(StrEnum):  # Triton's repository index states
    LOADING = "LOADING"
    READY = "READY"
    UNLOADING = "UNLOADING"
    UNAVAILABLE = "UNAVAILABLE"


class UnknownModel(LookupError):
    """No such model (or version) in this server: 404."""


class ModelLoadError(RuntimeError):
    """A model failed to load and the server runs ``strict``."""


ControlMode = Literal["none", "explicit", "poll"]
# Triton's words (model_repository_manager) for a load/unload request outside explicit mode,
# with UNAVAILABLE: HTTP 503, gRPC UNAVAILABLE (qa/L0_http, qa/L0_grpc python_*_aio_test.py).
CONTROL_REFUSED = "explicit model load / unload is not allowed if polling is enabled"


class ModelControlRefused(RuntimeError):
    """A client asked to load or unload outside explicit mode: 503 / UNAVAILABLE."""

    def __init__(self) -> None:
        super().__init__(CONTROL_REFUSED)


def unknown_load_message(name: str) -> str:
    """Triton's words for loading a name the repository does not hold (and ours after them)."""
    return (
        f"failed to load '{name}', failed to poll from model repository: no model '{name}' in the repository"
    )


def load_failure(name: str, entries: Sequence[ModelEntry]) -> str | None:
    """Triton's INVALID_ARG message for a load whose versions did not all come up, or None."""
    failed = [e for e in entries if e.state is not ModelState.READY]
    if not failed:
        return None
    return "".join(
        f"load failed for model '{name}': version {e.version or '?'}: {e.reason}\n" for e in failed
    )


@dataclass
class ModelEntry:
    name: str
    version: str  # "" when the model's configuration could not even be read
    state: ModelState
    reason: str = ""
    runtime: ModelRuntime | None = None
    plan: ModelPlan | None = None

    def index_doc(self) -> dict[str, str]:
        return {"name": self.name, "version": self.version, "state": self.state.value, "reason": self.reason}


RuntimeFactory = Callable[[ModelPlan], ModelRuntime]


class ModelSet:
    def __init__(
        self,
        source: ModelSource,
        make_runtime: RuntimeFactory,
        *,
        strict: bool = False,
        mode: ControlMode = "none",
        startup: Sequence[str] = (),
        poll_s: float = 15.0,
        poller: Callable[[ModelSet, float], Any] | None = None,
    ) -> None:
        self.source = source
        self.make_runtime = make_runtime
        self.strict = strict
        self.mode: ControlMode = mode
        self.poll_s = poll_s
        # poll mode: what watches the repository (server.models.repository.poll.RepositoryPoller,
        # given by the app: the poller drives this set, so this module does not import it)
        self._make_poller = poller
        self.poller: Any = None
        self.draining = False
        self.leaving = False  # SIGTERM seen: not ready, still accepting (drain grace)
        self.started = False
        self._models: dict[str, dict[str, ModelEntry]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        # what a config override loaded, kept for a later load without one (Triton keeps it)
        self._overrides: dict[str, Any] = {}
        everything = mode != "explicit" or list(startup) == ["*"]
        for name in source.names() if everything else dict.fromkeys(startup):
            try:
                self._plan(name)
            except KeyError:  # --load-model names a model the repository lacks
                reason = unknown_load_message(name)
                if strict:
                    raise ModelLoadError(reason) from None
                self._models[name] = {"": ModelEntry(name, "", ModelState.UNAVAILABLE, reason)}

    # ------------------------------------------------------------------ lookup
    def lookup(self, name: str, version: str | None = None) -> ModelEntry:
        """The entry of ``name`` at ``version`` (None or "": the newest READY one, else the newest)."""
        versions = self._models.get(name)
        if not versions:
            # Triton's words, which its clients match on; never a list of what else is served
            raise UnknownModel(f"Request for unknown model: '{name}' is not found")
        if version:
            entry = versions.get(version)
            if entry is None:
                raise UnknownModel(f"Request for unknown model: '{name}' version {version} is not found")
            return entry
        if len(versions) == 1:  # the common case, on every request: no list, no sort
            return next(iter(versions.values()))
        ready = [e for e in versions.values() if e.state is ModelState.READY]
        pool = ready or list(versions.values())
        return max(pool, key=lambda e: int(e.version) if e.version.isdigit() else -1)

    def entries(self) -> list[ModelEntry]:
        return [e for name in sorted(self._models) for _, e in sorted(self._models[name].items())]

    def index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """Triton's repository index: every model the repository holds, with state and reason."""
        known = {e.name for e in self.entries()}
        docs = [e.index_doc() for e in self.entries() if not ready_only or e.state is ModelState.READY]
        if not ready_only:  # models added to the repository since start-up: not loaded yet
            for name in self.source.names():
                if name not in known:
                    docs.append({"name": name, "version": "", "state": ModelState.UNAVAILABLE.value,
                                 "reason": "not loaded"})  # fmt: skip
        return docs

    @property
    def ready(self) -> bool:
        """Server readiness: start-up finished, not draining, and at least one model serves, or
        none was asked to (explicit mode without ``--load-model``, or every model unloaded:
        Triton is ready then too)."""
        if not self.started or self.draining or self.leaving:
            return False
        entries = self.entries()
        return any(e.state is ModelState.READY for e in entries) or all(
            e.state is ModelState.UNAVAILABLE and e.reason == "unloaded" for e in entries
        )

    def closing(self) -> bool:
        """The server drains, or every model it serves does (what ``Connection: close`` follows).
        Called on every response: stops at the first model still serving, builds nothing."""
        if self.draining:
            return True
        seen = False
        for versions in self._models.values():
            for entry in versions.values():
                if entry.runtime is not None:
                    if not entry.runtime.draining:
                        return False
                    seen = True
        return seen

    def runtimes(self) -> list[ModelRuntime]:
        return [e.runtime for e in self.entries() if e.runtime is not None]

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Load every model, all at once (engines build on threads); failures stay UNAVAILABLE."""
        await asyncio.gather(*(self._start_entries(name) for name in list(self._models)))
        self.started = True
        freeze_heap()
        failed = [e for e in self.entries() if e.state is not ModelState.READY]
        for entry in failed:
            log.error("model %s version %s is not ready: %s", entry.name, entry.version or "?", entry.reason)
        if failed and self.strict:
            reasons = "; ".join(f"{e.name}: {e.reason}" for e in failed)
            raise ModelLoadError(f"strict: {len(failed)} model(s) failed to load: {reasons}")
        if self.mode == "poll":
            if self._make_poller is None:
                raise ModelLoadError("poll mode needs a repository poller")
            self.poller = self._make_poller(self, self.poll_s)
            await self.poller.start()

    def check_control(self) -> None:
        """Refuse a client's load/unload outside explicit mode, in Triton's words."""
        if self.mode != "explicit":
            raise ModelControlRefused()

    async def load(self, name: str, override: Any = None) -> list[ModelEntry]:
        """A client's load (explicit mode only). ``override``: what the source's
        ``plans_override`` takes (a config, files); without one, a model last loaded with an
        override keeps it, as Triton does until the model is unloaded."""
        self.check_control()
        if override is None:
            override = self._overrides.get(name)
        return await self.reload(name, override)

    async def unload(self, name: str) -> None:
        """A client's unload (explicit mode only)."""
        self.check_control()
        await self.retire(name)

    async def reload(self, name: str, override: Any = None) -> list[ModelEntry]:
        """(Re)load ``name`` from the source: the old versions are drained and freed first.
        The model's files are read on a thread (a large ONNX file may be read to complete
        its config), never on the event loop."""
        if self.draining:
            raise ModelLoadError("server is draining")
        async with self._lock(name):
            if name in self._models:
                await self._stop_entries(name, reason="reloading")
            try:
                plans = await asyncio.to_thread(self._read_plans, name, override)
            except KeyError:
                self._models.pop(name, None)  # gone from the repository
                raise UnknownModel(unknown_load_message(name)) from None
            except Exception as exc:  # ConfigError and anything else reading the model's files
                if override is not None and override is not self._overrides.get(name):
                    override.close()  # a rejected override leaves no temporary files
                self._models[name] = {"": ModelEntry(name, "", ModelState.UNAVAILABLE, str(exc))}
                return list(self._models[name].values())
            self._install(name, plans)
            self._remember_override(name, override)
            await self._start_entries(name)
            freeze_heap()
            return list(self._models[name].values())

    async def retire(self, name: str, forget: bool = False) -> None:
        """Stop accepting for ``name``, answer everything it accepted, then free its engines.
        ``forget``: the model left the repository, so it leaves the index too (poll mode)."""
        if name not in self._models:
            raise UnknownModel(f"unknown model {name!r}")
        async with self._lock(name):
            await self._stop_entries(name, reason="unloaded")
            self._remember_override(name, None)
            if forget:
                self._models.pop(name, None)
            freeze_heap()

    def loaded_names(self) -> list[str]:
        """Models with an entry (loaded, failed or unloaded), for the poller."""
        return sorted(self._models)

    async def drain(self, grace_s: float = 0.0) -> None:
        """SIGTERM: every model stops accepting and answers what it accepted.

        With ``grace_s``, readiness goes false at once but requests are still accepted for
        that long first, so a load balancer health-checking /v2/health/ready stops sending
        before the server starts refusing (no 503 window during a rolling restart)."""
        if grace_s > 0 and not self.draining:
            self.leaving = True
            log.info("not ready; still accepting for %.1fs before draining", grace_s)
            await asyncio.sleep(grace_s)
        self.draining = True
        await asyncio.gather(*(r.drain() for r in self.runtimes()))

    async def stop(self) -> None:
        self.draining = True
        if self.poller is not None:
            await self.poller.stop()
        for override in self._overrides.values():
            override.close()  # temporary model directories of 'file:' loads
        await asyncio.gather(*(r.stop() for r in self.runtimes()), return_exceptions=True)

    # ------------------------------------------------------------------ internals
    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())

    def _read_plans(self, name: str, override: Any) -> list[ModelPlan]:
        if override is None:
            return self.source.plans(name)
        plans_override = getattr(self.source, "plans_override", None)
        if plans_override is None:
            raise ValueError("a load with a 'config' or 'file:' override needs a model repository "
                             "(--model-repository)")  # fmt: skip
        return plans_override(name, override)

    def _remember_override(self, name: str, override: Any) -> None:
        old = self._overrides.pop(name, None)
        if old is not None and old is not override and hasattr(old, "close"):
            old.close()  # its temporary model directory, if it had files
        if override is not None:
            self._overrides[name] = override

    def _plan(self, name: str) -> None:
        """Read the model's configuration and make (unstarted) runtimes; a bad configuration
        becomes an UNAVAILABLE entry with the reason."""
        try:
            plans = self.source.plans(name)
        except KeyError:
            raise
        except Exception as exc:  # ConfigError and anything else reading the model's files
            self._models[name] = {"": ModelEntry(name, "", ModelState.UNAVAILABLE, str(exc))}
            if self.strict and not self.started:
                raise ModelLoadError(str(exc)) from exc
            return
        self._install(name, plans)

    def _install(self, name: str, plans: list[ModelPlan]) -> None:
        entries = {}
        for plan in plans:
            runtime = self.make_runtime(plan)
            entries[plan.version] = ModelEntry(name, plan.version, ModelState.LOADING, "", runtime, plan)
        self._models[name] = entries

    async def _start_entries(self, name: str) -> None:
        async def start(entry: ModelEntry) -> None:
            if entry.runtime is None or entry.state is not ModelState.LOADING:
                return
            try:
                await entry.runtime.start()
            except Exception as exc:
                log.exception("loading %s version %s failed", entry.name, entry.version)
                entry.state, entry.reason = ModelState.UNAVAILABLE, f"{type(exc).__name__}: {exc}"
                entry.runtime = None
                return
            entry.state, entry.reason = ModelState.READY, ""

        await asyncio.gather(*(start(e) for e in self._models[name].values()))

    async def _stop_entries(self, name: str, reason: str) -> None:
        entries = [e for e in self._models[name].values() if e.runtime is not None]
        for entry in entries:
            entry.state = ModelState.UNLOADING
        await asyncio.gather(*(e.runtime.stop() for e in entries if e.runtime is not None))
        for entry in entries:
            entry.state, entry.reason, entry.runtime = ModelState.UNAVAILABLE, reason, None


class ModelSetActivity:
    """Every model's batching activity summed (``lifecycle.BatchActivity``, what the
    ``IdleTrimmer`` reads), so memory is trimmed only when the whole server is idle."""

    def __init__(self, models: ModelSet) -> None:
        self.models = models

    def _batchers(self) -> list[Any]:
        return [r.batcher for r in self.models.runtimes() if r.batcher is not None]

    @property
    def inflight(self) -> int:
        return sum(b.inflight for b in self._batchers())

    @property
    def last_batch_at(self) -> float:
        return max((b.last_batch_at for b in self._batchers()), default=0.0)
