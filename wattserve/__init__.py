"""wattserve: an energy-aware batching inference server (KServe v2 / Triton protocol).

The source folders at the repository root (``server/``, ``batchers/``, ``engines/``,
``telemetry/``, ``loadgen/``) install as subpackages of this one (pyproject's
``package-dir``), so installing wattserve adds a single top-level name to site-packages.
"""

import os
from importlib import metadata
from pathlib import Path

# In a source checkout (pyproject.toml beside this folder) the subpackages are the sibling
# folders: found here, a checkout runs with only PYTHONPATH pointing at it, and an editable
# install resolves them to the same files. An installed wheel has them inside this folder.
# Type checkers do not run this: scripts/typecheck_tree.py gives mypy the same view.
_CHECKOUT = Path(__file__).resolve().parent.parent
if (_CHECKOUT / "pyproject.toml").is_file() and (_CHECKOUT / "server" / "__init__.py").is_file():
    __path__.append(str(_CHECKOUT))

try:
    __version__ = metadata.version("wattserve")
except metadata.PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"


def with_checkout_on_path(env: dict[str, str]) -> dict[str, str]:
    """``env`` with this source checkout first on PYTHONPATH (unchanged for an installed
    wheel), so a child process started with it imports the same files from any directory."""
    if str(_CHECKOUT) in __path__:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_CHECKOUT), env.get("PYTHONPATH")]))
    return env
