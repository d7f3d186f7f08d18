"""Package layering: batchers/ and engines/ sit below server/ and never import it; inside
server/, the HTTP and gRPC front ends sit over a protocol-neutral core (server/core/) and
never import each other.

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


# ---------------------------------------------------------------- server/: two front ends over one core
SERVER = ROOT / "server"
FRAMEWORKS = ("starlette", "fastapi", "grpc", "tritonclient", "google.protobuf", "uvicorn")
# server/security.py is not listed: its restricted-API groups are parsed once for both
# (gRPC reads them from metadata), beside HTTP's ASGI middleware
HTTP_FRONT = (
    "wattserve.server.routes",
    "wattserve.server.fast_path",
    "wattserve.server.http_status",
    "wattserve.server.http_protocol",
    "wattserve.server.middleware",
)  # fmt: skip
GRPC_FRONT = ("wattserve.server.grpc_service", "wattserve.server.grpc_codec", "wattserve.server.grpc_wire",
              "wattserve.server.grpc_access")  # fmt: skip
CORE_MAY_NOT = (*FRAMEWORKS, *HTTP_FRONT, *GRPC_FRONT, "wattserve.server.app")


def within(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def server_imports(path: Path) -> list[tuple[int, str]]:
    return imported_modules(path, "server")


def test_the_core_knows_no_protocol():
    """server/core/ is what both front ends translate to: no web or RPC framework, no front end."""
    sources = sorted((SERVER / "core").rglob("*.py"))
    assert sources, "no sources under server/core/"
    bad = [
        f"{path.relative_to(ROOT)}:{line}: {module}"
        for path in sources
        for line, module in server_imports(path)
        if within(module, CORE_MAY_NOT)
    ]
    assert not bad, "protocol imports in the core:\n" + "\n".join(bad)


def test_the_front_ends_never_import_each_other():
    grpc_sources = sorted(SERVER.glob("grpc_*.py"))
    http_sources = [*sorted((SERVER / "routes").rglob("*.py")), SERVER / "fast_path.py"]
    assert grpc_sources and len(http_sources) > 2
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
        "from wattserve.server.routes.inference import X\nfrom starlette.requests import Request\n"
    )
    modules = [m for _, m in server_imports(sample)]
    assert [m for m in modules if within(m, HTTP_FRONT)] == [
        "wattserve.server.routes.inference", "wattserve.server.routes.inference.X",
    ]  # fmt: skip
    assert [m for m in modules if within(m, CORE_MAY_NOT)][-2:] == [
        "starlette.requests",
        "starlette.requests.Request",
    ]
