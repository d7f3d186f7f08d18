"""One instance of a Triton Python model run in its own worker process (process isolation).

The engine surface is ``PythonModelEngine``'s (``RunsRequests``, ``CallsModels``), so the
batcher, BLS wiring and warm-up treat both modes alike; the model itself runs in a worker
process (``stub_host.StubHost``), whose GIL, crashes and hangs are its own. What this class
adds is the restart policy, after Triton's python backend:

- a worker that dies (a segfault, ``os._exit``, killed) fails the requests of the batch it
  was running, each with one INTERNAL error ("Stub process ... is not healthy"), and a new
  worker is started at once in the background; the next batch waits for it;
- an ``execute`` that outlasts ``python_execute_timeout_s`` is treated the same way (the
  worker is killed first). Unset, as Triton, a live worker is waited on as long as it takes;
- a worker that cannot be restarted (``initialize`` now fails) fails each batch with that
  reason, and the next batch tries again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future

import numpy as np
from wattserve.engines.python_backend import custom_metrics
from wattserve.engines.python_backend.engine import ModelFailed, PythonModelFile
from wattserve.engines.python_backend.stub_host import StubFailed, StubHost
from wattserve.engines.ragged import with_batch_inputs
from wattserve.engines.request_engines import ModelCaller, RequestInput

log = logging.getLogger("wattserve.python_backend")


class ProcessModelEngine:
    """A ``TritonPythonModel`` instance in a worker process; ``RunsRequests``, ``CallsModels``."""

    platform = "python"

    def __init__(
        self,
        model: PythonModelFile,
        *,
        device: str = "cpu",
        instance: int = 0,
        execute_timeout_s: float | None = None,
        stub_timeout_s: float = 30.0,
    ) -> None:
        self.model = model
        self.name = model.name
        self.inputs = model.inputs
        self.outputs = model.outputs
        self.max_batch_size = model.max_batch_size
        self.batch_sizes = None
        self.device = device
        self.instance_name = f"{model.name}_0_{instance}"
        self._failed = f"Failed to process the request(s) for model instance '{self.instance_name}', message:"
        self._instance = instance
        self._execute_timeout = execute_timeout_s
        self._stub_timeout = stub_timeout_s
        self._store = custom_metrics.bound_store()  # the app's, bound while the engine is built
        self._caller: ModelCaller | None = None
        self._restart: Future[StubHost] | None = None
        self._host: StubHost | None = self._start()  # an initialize that fails fails the load
        self.restarts = 0  # workers started after the first (tests, logs)

    def _start(self) -> StubHost:
        return StubHost(self.model, self.device, self._instance, self._store, lambda: self._caller,
                        self._stub_timeout)  # fmt: skip

    # ------------------------------------------------------------------ capabilities
    def bind_models(self, call: ModelCaller) -> None:
        self._caller = call

    def warmup(self, batch_sizes: Sequence[int]) -> None:
        """Nothing, as ``PythonModelEngine.warmup``."""

    def infer(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        (answer,) = self.run_requests([(batch, None, _never)])
        if isinstance(answer, BaseException):
            raise answer
        return answer

    @property
    def pid(self) -> int | None:
        """The current worker's process id (None while none runs)."""
        host = self._host
        return host.process.pid if host is not None and host.dead is None else None

    # ------------------------------------------------------------------ execute
    def run_requests(self, requests: Sequence[RequestInput]) -> list[dict[str, np.ndarray] | BaseException]:
        host = self._current()
        if isinstance(host, BaseException):
            failure = ModelFailed(f"{self._failed} the model's process could not be restarted: {host}")
            return [failure for _ in requests]
        if self.model.batch_inputs:
            requests = with_batch_inputs(requests, self.model.batch_inputs)
        try:
            return host.execute(requests, self._execute_timeout)
        except OSError as exc:  # shared memory refused (e.g. /dev/shm full): this batch only
            failure = ModelFailed(f"{self._failed} shared memory for the request(s): {exc}")
            return [failure for _ in requests]
        except StubFailed as exc:
            self._restart_soon()
            failure = ModelFailed(f"{self._failed} {exc}")
            ended = exc.streamed or [False] * len(requests)
            return [{} if done else failure for done in ended]  # {}: its stream's final went out

    def _current(self) -> StubHost | BaseException:
        """The worker to run on: the one restarting (waited for), the live one, or a new one
        if it died between batches; the error if none could be started."""
        if self._restart is not None:
            restart, self._restart = self._restart, None
            try:
                self._host = restart.result()
            except Exception as exc:
                return exc
        if self._host is None or self._host.dead is not None:
            if self._host is not None:  # it died between batches (a thread of the model's)
                self._host.close()
            self._host = None
            try:
                self._host = self._start()
                self.restarts += 1
            except Exception as exc:
                log.error("Python model instance %r could not be restarted: %s", self.instance_name, exc)
                return exc
        return self._host

    def _restart_soon(self) -> None:
        """Start the next worker now, off the engine thread, so the batch's answers go first."""
        old, self._host = self._host, None
        future: Future[StubHost] = Future()

        def restart() -> None:
            if old is not None:
                old.close()
            try:
                future.set_result(self._start())
                self.restarts += 1
                log.warning("Python model instance %r restarted", self.instance_name)
            except BaseException as exc:
                future.set_exception(exc)

        self._restart = future
        threading.Thread(target=restart, name=f"pb-{self.instance_name}-restart", daemon=True).start()

    def close(self) -> None:
        restart, self._restart = self._restart, None
        if restart is not None:
            try:
                self._host = restart.result()
            except Exception:
                self._host = None
        if self._host is not None:
            self._host.close()
            self._host = None


def _never() -> bool:
    return False
