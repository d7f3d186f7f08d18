"""pytest-xdist's loadfile scheduling, with every file that holds a serial test on one worker.

A test marked serial (tests/serial_lock.py) waits until the test on every other worker has
ended, and no other test starts until it has. xdist's loadfile hands files to whichever worker
asks next, so serial files met whatever ran beside them: behind the 90 s thesis study a serial
test held the other worker idle for 36 s, and with every worker in a serial file at once their
ordinary tests queued behind each other's serial ones (56 s for 22 CPU-s on three workers).

Here the first worker takes the serial files, one after another, before anything else; until
they are done the other workers take files outside ``long_files`` (whose single tests would
keep a serial test waiting), then everything in queue order. A worker is never refused work
(an idle xdist worker is not asked again), so when only serial or long files are left, it gets
one of those.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from xdist.scheduler import LoadFileScheduling


class SerialFilesOnOneWorker(LoadFileScheduling):
    def __init__(self, config: pytest.Config, log, serial_files: Sequence[str], long_files: Sequence[str]):
        super().__init__(config, log)
        self.serial_files = frozenset(serial_files)
        self.long_files = frozenset(long_files)

    def _serial_node(self):
        return self.nodes[0] if self.nodes else None

    def _serial_files_pending(self) -> bool:
        if any(scope in self.serial_files for scope in self.workqueue):
            return True
        return any(
            scope in self.serial_files and not all(done.values())
            for work in self.assigned_work.values()
            for scope, done in work.items()
        )

    def _choose(self, node) -> str:
        scopes = list(self.workqueue)
        if node is self._serial_node():
            wanted = [s for s in scopes if s in self.serial_files]
        elif self._serial_files_pending():
            wanted = [s for s in scopes if s not in self.serial_files and s not in self.long_files]
            wanted = wanted or [s for s in scopes if s not in self.serial_files]
        else:
            wanted = [s for s in scopes if s not in self.serial_files]
        return (wanted or scopes)[0]

    def _assign_work_unit(self, node) -> None:
        """xdist's LoadScopeScheduling._assign_work_unit, with the scope chosen as above
        instead of the first in the queue."""
        assert self.workqueue
        scope = self._choose(node)
        work_unit = self.workqueue.pop(scope)
        assigned_to_node = self.assigned_work.setdefault(node, {})
        assigned_to_node[scope] = work_unit
        worker_collection = self.registered_collections[node]
        node.send_runtest_some(
            [worker_collection.index(nodeid) for nodeid, completed in work_unit.items() if not completed]
        )
