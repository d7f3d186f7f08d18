"""Triton's ``--model-control-mode=poll``: rescan the repository, load what changed.

Every ``repository_poll_secs`` the poller lists the repository and fingerprints each model
directory (every file's path, modification time and size: config.pbtxt, version folders,
label files), all on a worker thread so the event loop never waits on the disk. Then, on
the loop: a new directory is loaded, a changed one reloaded (its versions drained first),
a removed one unloaded and dropped from the index (docs/user_guide/model_management.md,
"Model Control Mode POLL"). A model whose files change while being read is simply seen
again, changed, at the next poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from wattserve.server.models.model_set import ModelSet, UnknownModel

log = logging.getLogger("wattserve.repository.poll")

Fingerprints = dict[str, Any]


class RepositoryPoller:
    """One background task per server in poll mode (started and stopped by the lifespan)."""

    def __init__(self, models: ModelSet, interval_s: float) -> None:
        self.models = models
        self.interval_s = interval_s
        self.polls = 0
        self._seen: Fingerprints = {}
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Take the repository as loaded at start-up as the baseline, then watch it."""
        self._seen = await asyncio.to_thread(self._scan)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="repository-poller")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.poll_once()
            except Exception:  # a poll that fails must not end polling
                log.exception("polling the model repository failed")

    async def poll_once(self) -> None:
        """One rescan: load new models, reload changed ones, unload removed ones."""
        current = await asyncio.to_thread(self._scan)
        before, self._seen = self._seen, current
        self.polls += 1
        if self.models.draining:
            return
        for name in sorted(set(before) - set(current)):
            log.info("poll: model %s left the repository; unloading", name)
            with contextlib.suppress(UnknownModel):
                await self.models.retire(name, forget=True)
        for name in sorted(current):
            if name in before and before[name] == current[name]:
                continue
            log.info("poll: model %s %s; loading", name, "changed" if name in before else "appeared")
            try:
                await self.models.reload(name)
            except UnknownModel:  # gone between the scan and the load: the next poll drops it
                continue

    def _scan(self) -> Fingerprints:
        source = self.models.source
        fingerprint = getattr(source, "fingerprint", None)
        return {name: fingerprint(name) if fingerprint else None for name in source.names()}
