"""``python -m benchmarks``: one door to every benchmark, run as a user would (a subprocess,
so no test imports ``benchmarks``)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def suite(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def runnable_modules() -> set[str]:
    """Every benchmarks/*.py (not _shared) that a user can run: a main guard at module level."""
    names = set()
    for path in (ROOT / "benchmarks").glob("*.py"):
        if path.name.startswith("_"):
            continue
        tree = ast.parse(path.read_text())
        if any(isinstance(n, ast.If) and "__main__" in ast.unparse(n.test) for n in tree.body):
            names.add(path.stem)
    return names


def test_the_list_names_every_benchmark_with_its_first_line():
    done = suite()
    assert done.returncode == 0, done.stderr
    listed = {line.split()[0]: line for line in done.stdout.splitlines() if line.startswith("  ")}
    expected = runnable_modules()
    assert expected and set(listed) == expected
    assert "torch vs ONNX Runtime" in listed["engines_cpu"]
    assert "_harness" not in listed


def test_a_benchmark_runs_by_name_with_its_own_arguments():
    done = suite("telemetry_read_cost", "--help")
    assert done.returncode == 0, done.stderr
    assert "--reads" in done.stdout


def test_an_unknown_name_is_refused_with_the_list():
    done = suite("no_such_benchmark")
    assert done.returncode == 2
    assert "no benchmark named 'no_such_benchmark'" in done.stderr and "engines_cpu" in done.stderr
