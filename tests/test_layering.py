"""Package layering: batchers/ and engines/ sit below server/ and never import it; inside
server/, the HTTP and gRPC front ends (server/http/, server/grpc/) sit over protocol-neutral
groups (server/core/, server/models/, server/extensions/) and never import each other.

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
        "import wattserve.server.models.metrics\nfrom ..server import settings\nfrom wattserve.engines import base\n"
    )
    modules = [m for _, m in imported_modules(sample, "batchers")]
    assert [m for m in modules if upward(m)] == [
        "wattserve.server.models.metrics", "wattserve.server", "wattserve.server.settings",
    ]  # fmt: skip


# ---------------------------------------------------------------- server/: grouped by what it serves
SERVER = ROOT / "server"
# At the top of server/ only the wiring: the app factory, CLI, settings, process lifecycle,
# access control (parsed once for both front ends). Everything else lives in a group.
TOP_LEVEL = {"__init__", "__main__", "app", "cli", "engine_commands", "lifecycle", "security", "settings"}
# split/: the process roles over both front ends (front-end processes, the engine core's
# channel, the supervisor): wiring too, one level down, so no group below imports it.
GROUPS = {"core", "extensions", "grpc", "http", "models", "split"}
FRAMEWORKS = ("starlette", "fastapi", "grpc", "tritonclient", "uvicorn")
HTTP_FRONT = ("wattserve.server.http",)
GRPC_FRONT = ("wattserve.server.grpc",)
FRONT_ENDS = (*HTTP_FRONT, *GRPC_FRONT, "wattserve.server.app")
# What each protocol-neutral group may not import: no web or RPC framework, no front end. The
# core (the requests both front ends translate to) not even protobuf; a model's configuration
# is protobuf text (config.pbtxt), so models/ reads it with google.protobuf.
NEUTRAL_MAY_NOT = {
    "core": (*FRAMEWORKS, "google.protobuf", *FRONT_ENDS),
    "models": (*FRAMEWORKS, *FRONT_ENDS),
    "extensions": (*FRAMEWORKS, "google.protobuf", *FRONT_ENDS),
}


def within(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def server_imports(path: Path) -> list[tuple[int, str]]:
    return imported_modules(path, "server")


def test_the_top_of_server_holds_only_wiring():
    modules = {path.stem for path in SERVER.glob("*.py")}
    folders = {path.name for path in SERVER.iterdir() if path.is_dir() and (path / "__init__.py").is_file()}
    assert modules == TOP_LEVEL, f"put new server modules in a group ({sorted(GROUPS)})"
    assert folders == GROUPS


@pytest.mark.parametrize("group", sorted(NEUTRAL_MAY_NOT))
def test_the_neutral_groups_know_no_protocol(group):
    """core/, models/ and extensions/ are what both front ends translate to and serve from."""
    sources = sorted((SERVER / group).rglob("*.py"))
    assert sources, f"no sources under server/{group}/"
    bad = [
        f"{path.relative_to(ROOT)}:{line}: {module}"
        for path in sources
        if path.name != "model_config_pb2.py"  # generated: protobuf's own runtime
        for line, module in server_imports(path)
        if within(module, NEUTRAL_MAY_NOT[group])
    ]
    assert not bad, f"protocol imports in server/{group}/:\n" + "\n".join(bad)


def test_nothing_below_the_wiring_imports_the_process_split():
    """The groups serve one process as well as many: the split is built on them, never
    the other way round (only app.py and cli.py, the wiring, start it)."""
    bad = [
        f"{path.relative_to(ROOT)}:{line}: {module}"
        for group in sorted(GROUPS - {"split"})
        for path in sorted((SERVER / group).rglob("*.py"))
        for line, module in server_imports(path)
        if within(module, ("wattserve.server.split",))
    ]
    assert not bad, "a group imports server/split:\n" + "\n".join(bad)


def test_the_front_ends_never_import_each_other():
    grpc_sources = sorted((SERVER / "grpc").rglob("*.py"))
    http_sources = sorted((SERVER / "http").rglob("*.py"))
    assert len(grpc_sources) > 2 and len(http_sources) > 2
    bad = [
        f"{path.relative_to(ROOT)}:{line}: {module}"
        for sources, other in ((grpc_sources, HTTP_FRONT), (http_sources, GRPC_FRONT))
        for path in sources
        for line, module in server_imports(path)
        if within(module, other)
    ]
    assert not bad, "one front end imports the other:\n" + "\n".join(bad)


def test_the_front_end_check_sees_a_cross_import(tmp_path):
    sample = tmp_path / "grpc_sample.py"
    sample.write_text(
        "from wattserve.server.http.routes.inference import X\nfrom starlette.requests import Request\n"
    )
    modules = [m for _, m in server_imports(sample)]
    assert [m for m in modules if within(m, HTTP_FRONT)] == [
        "wattserve.server.http.routes.inference", "wattserve.server.http.routes.inference.X",
    ]  # fmt: skip
    assert [m for m in modules if within(m, NEUTRAL_MAY_NOT["core"])][-2:] == [
        "starlette.requests",
        "starlette.requests.Request",
    ]


def server_cycle(root: Path) -> list[str]:
    """A cycle of imports among every module under ``root`` (``wattserve.server``, nested
    groups included), with the first repeated at the end; [] when there is none."""
    modules: dict[str, Path] = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(["wattserve.server", *parts])] = path
    graph = {
        name: {m for _, m in server_imports(path) if m in modules and m not in (name, "wattserve.server")}
        for name, path in modules.items()
    }
    try:
        tuple(TopologicalSorter(graph).static_order())
    except CycleError as error:
        return list(error.args[1])
    return []


def test_no_import_cycle_in_server():
    """Lazy imports count (the same dependency, only later): e.g. the repository poller drives
    the model set, so the app hands the set its poller rather than the set importing it."""
    cycle = server_cycle(SERVER)
    assert not cycle, "import cycle in server/: " + " -> ".join(cycle)


def test_the_server_cycle_check_sees_a_nested_cycle(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "__init__.py").write_text("")
    (tmp_path / "models" / "model_set.py").write_text(
        "def start():\n    from wattserve.server.models.poll import Poller\n"
    )
    (tmp_path / "models" / "poll.py").write_text("from wattserve.server.models.model_set import ModelSet\n")
    assert set(server_cycle(tmp_path)) == {
        "wattserve.server.models.model_set",
        "wattserve.server.models.poll",
    }
    (tmp_path / "models" / "poll.py").write_text("import asyncio\n")
    assert server_cycle(tmp_path) == []


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
