"""The one harness that starts servers for tests, benchmarks, the study runner and scripts."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from wattserve.loadgen.server_process import ServerProcess, free_port, serve_command


def test_serve_command_keeps_an_older_checkouts_entry_point(tmp_path: Path) -> None:
    """A checkout from before the namespace has only ``python -m server``; benchmarks that
    compare against it must start it that way, and a current checkout as ``wattserve``."""
    assert serve_command(tmp_path)[1:] == ["-m", "server", "serve"]
    (tmp_path / "wattserve").mkdir()
    (tmp_path / "wattserve" / "__init__.py").write_text("")
    assert serve_command(tmp_path)[1:] == ["-m", "wattserve", "serve"]
    assert serve_command()[0] == sys.executable


def test_a_server_that_dies_fails_fast_with_its_log(tmp_path: Path) -> None:
    proc = ServerProcess(
        ["{python}", "-c", "import sys; print('bad setting: port {port}'); sys.exit(3)"], {}, free_port(),
        log_path=tmp_path / "dead.log",
    )  # fmt: skip
    proc.start()
    with pytest.raises(RuntimeError, match=r"exited with code 3[\s\S]*bad setting: port \d+"):
        proc.wait_ready(30)
    assert proc.stop() == 3


def _http_server(folder: Path) -> list[str]:
    return ["{python}", "-m", "http.server", "{port}", "--bind", "127.0.0.1", "--directory", str(folder)]


def test_context_manager_waits_for_ready_and_stops(tmp_path: Path) -> None:
    """Any HTTP program works (benchmarks start a bare app and Triton this way); the
    server is gone after the block."""
    (tmp_path / "ready").write_text("ok")
    with ServerProcess(_http_server(tmp_path), {}, free_port(), ready_path="/ready") as server:
        assert server.alive
    assert not server.alive
    assert server.exit_code is not None


def test_a_ready_path_that_never_answers_200_times_out(tmp_path: Path) -> None:
    proc = ServerProcess(_http_server(tmp_path), {}, free_port(), ready_path="/missing").start()
    try:
        with pytest.raises(RuntimeError, match="not ready after"):
            proc.wait_ready(1.5)
    finally:
        proc.stop()


def test_a_temporary_log_is_deleted_at_stop_and_still_readable() -> None:
    proc = ServerProcess(["{python}", "-c", "print('served on {port}')"], {}, free_port()).start()
    proc.proc.wait(30)
    path = proc.log_path
    assert path is not None and path.exists()
    proc.stop()
    assert not path.exists(), "benchmarks start hundreds of servers: no log left behind"
    assert "served on" in proc.log()


def test_a_log_path_the_caller_gave_is_kept(tmp_path: Path) -> None:
    proc = ServerProcess(
        ["{python}", "-c", "print('kept')"], {}, free_port(), log_path=tmp_path / "s.log"
    ).start()
    proc.proc.wait(30)
    proc.stop()
    assert (tmp_path / "s.log").read_text().strip() == "kept" and "kept" in proc.log()
