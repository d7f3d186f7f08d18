"""Package layering: batchers/ and engines/ sit below server/ and never import it.

server/ builds batchers over engines and wires them to HTTP, metrics and telemetry; an
import the other way would tie the core to the web layer (and invite import cycles).
What both need lives in a neutral module (e.g. telemetry/buckets.py). Within a package the
modules import each other without a cycle (engines/catalog.py holds what the registry and the
engine modules share)."""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LOWER = ("batchers", "engines")
# Packages whose modules must import each other without a cycle (lazy imports inside
# functions count: they are the same dependency, only later).
ACYCLIC = ("batchers", "engines", "telemetry", "loadgen")


def imported_modules(path: Path, package: str) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in ``path``, relative ones resolved."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # from ..server import x, inside wattserve.<package>
                parts = ["wattserve", package][: max(0, 2 - (node.level - 1))]
                module = ".".join([*parts, module] if module else parts)
            found.append((node.lineno, module))
            found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return found


def upward(module: str) -> bool:
    return module in ("wattserve.server", "server") or module.startswith(("wattserve.server.", "server."))


@pytest.mark.parametrize("package", LOWER)
def test_lower_packages_never_import_server(package):
    sources = sorted((ROOT / package).rglob("*.py"))
    assert sources, f"no sources under {package}/"
    bad = [
        f"{path.relative_to(ROOT)}:{line}: {module}"
        for path in sources
        for line, module in imported_modules(path, package)
        if upward(module)
    ]
    assert not bad, "imports from server/ in a lower package:\n" + "\n".join(bad)


def test_the_check_sees_an_upward_import(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import wattserve.server.metrics\nfrom ..server import settings\nfrom wattserve.engines import base\n"
    )
    modules = [m for _, m in imported_modules(sample, "batchers")]
    assert [m for m in modules if upward(m)] == [
        "wattserve.server.metrics", "wattserve.server", "wattserve.server.settings",
    ]  # fmt: skip


def import_cycle(folder: Path, package: str) -> list[str]:
    """A cycle of imports among the modules directly in ``folder`` (``wattserve.<package>``),
    as module names with the first repeated at the end; [] when there is none."""
    modules = {path.stem: path for path in folder.glob("*.py") if path.stem != "__init__"}
    prefix = f"wattserve.{package}."
    graph = {
        name: {
            module.removeprefix(prefix)
            for _, module in imported_modules(path, package)
            if module.removeprefix(prefix) in modules and module.startswith(prefix)
        }
        for name, path in modules.items()
    }
    try:
        tuple(TopologicalSorter(graph).static_order())
    except CycleError as error:
        return list(error.args[1])
    return []


@pytest.mark.parametrize("package", ACYCLIC)
def test_no_import_cycle_among_a_packages_modules(package):
    cycle = import_cycle(ROOT / package, package)
    assert not cycle, f"import cycle in {package}/: " + " -> ".join(cycle)


def test_the_check_sees_an_import_cycle(tmp_path):
    # registry imports torch_engine lazily, torch_engine imports registry at the top: the
    # shape of the cycle engines/catalog.py broke.
    (tmp_path / "registry.py").write_text(
        "def build():\n    from wattserve.engines.torch_engine import Engine\n"
    )
    (tmp_path / "torch_engine.py").write_text("from .registry import NAMES\nfrom .base import Batch\n")
    (tmp_path / "base.py").write_text("import numpy\n")
    cycle = import_cycle(tmp_path, "engines")
    assert set(cycle) == {"registry", "torch_engine"}
    assert cycle[0] == cycle[-1]
    (tmp_path / "torch_engine.py").write_text("from .base import Batch\n")
    assert import_cycle(tmp_path, "engines") == []
