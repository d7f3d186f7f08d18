"""Package layering: batchers/ and engines/ sit below server/ and never import it.

server/ builds batchers over engines and wires them to HTTP, metrics and telemetry; an
import the other way would tie the core to the web layer (and invite import cycles).
What both need lives in a neutral module (e.g. telemetry/buckets.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LOWER = ("batchers", "engines")


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
