#!/usr/bin/env python3
"""The wheel kit for the lent GPU machine: every wheel wattserve needs that its image lacks.

The H200 machine has no network and Python 3.12 with torch, numpy, aiohttp, prometheus-client,
nvidia-ml-py, ... (scripts/gpu_image_packages.txt) but no fastapi, uvicorn or pydantic. This
walks wattserve's runtime requirements (pyproject.toml, then each installed distribution's own
``Requires-Dist``, extras included) in THIS environment, drops what the image already has,
downloads each remaining one at the version installed here (what the tests ran against) as a
binary wheel for the device's Python and platform, builds wattserve itself as a wheel, and
refuses a kit over the carry limit. On the device:

    python3 -m pip install --no-index --find-links .whl 'wattserve[diffusion]' && scripts/gpu_check.sh

``--python-version 3.11`` builds a kit for this machine's Python, for testing the kit here
(scripts/gpu_kit_selftest.sh). Only PyPI is asked, through pip.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
CARRY_LIMIT = 64 * 2**20  # the device tool's limit on everything that travels
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64", "linux_x86_64"]  # fmt: skip


# Extras whose wheels travel too: gpu_check.sh's text-to-image run needs diffusers (+ transformers)
KIT_EXTRAS = ("diffusion",)


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_list(path: Path) -> set[str]:
    lines = (ln.split("#", 1)[0].strip() for ln in path.read_text().splitlines())
    return {canonical(ln) for ln in lines if ln}


def project_requirements() -> list[Requirement]:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = [r for e in KIT_EXTRAS for r in project.get("optional-dependencies", {}).get(e, [])]
    return [Requirement(r) for r in [*project["dependencies"], *extras]]


def closure(python_version: str, image: set[str]) -> tuple[dict[str, str], set[str]]:
    """name -> installed version for every runtime requirement, recursively (extras followed),
    and the image's distributions that a carried one pins a version of.

    The image's own distributions are followed too: the image list may miss one of their needs
    (tzdata of python-dateutil), and pip resolves them on the device. When a carried wheel
    needs ``setuptools>=83`` or ``typing-extensions>=4.14`` we cannot know the image's
    version, so that wheel travels too (pip installs it only where the image's is older)."""
    env = {"python_version": python_version, "python_full_version": f"{python_version}.0",
           "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
           "implementation_name": "cpython", "platform_python_implementation": "CPython"}  # fmt: skip
    todo = [r for r in project_requirements() if r.marker is None or r.marker.evaluate({**env, "extra": ""})]
    found: dict[str, str] = {}
    pinned: set[str] = set()
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        req = todo.pop()
        key = (canonical(req.name), frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = md.distribution(req.name)
        except md.PackageNotFoundError:
            raise SystemExit(f"{req.name} is required but not installed here: install wattserve") from None
        found[canonical(req.name)] = dist.version
        for text in dist.requires or []:
            sub = Requirement(text)
            wanted = ["", *sorted(req.extras)]
            if sub.marker is None or any(sub.marker.evaluate({**env, "extra": e}) for e in wanted):
                todo.append(sub)
                if sub.specifier and canonical(sub.name) in image and canonical(req.name) not in image:
                    pinned.add(canonical(sub.name))
    return found, pinned


def pip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)


def download(name: str, version: str, dest: Path, python_version: str) -> Path:
    """The binary wheel for the device; a pure-Python one built here where PyPI has only sdists."""
    before = set(dest.glob("*.whl"))
    platforms = [a for p in PLATFORMS for a in ("--platform", p)]
    done = pip("download", "--no-deps", "--only-binary=:all:", "--python-version", python_version,
               "--implementation", "cp", *platforms, "-d", str(dest), f"{name}=={version}")  # fmt: skip
    if done.returncode != 0:
        with tempfile.TemporaryDirectory() as tmp:
            built = pip("wheel", "--no-deps", "-w", tmp, f"{name}=={version}")
            wheels = list(Path(tmp).glob("*.whl"))
            if built.returncode != 0 or not wheels or not wheels[0].name.endswith("-none-any.whl"):
                raise SystemExit(f"no wheel of {name}=={version} for Python {python_version}:\n"
                                 f"{done.stderr[-2000:]}{built.stderr[-2000:]}")  # fmt: skip
            shutil.copy(wheels[0], dest)
    new = set(dest.glob("*.whl")) - before
    return next(iter(new)) if new else next(dest.glob(f"{canonical(name).replace('-', '_')}-{version}-*.whl"))


def tree_bytes() -> int:
    """What the device tool sends besides the kit: tracked and untracked-not-ignored files."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, capture_output=True, check=True).stdout  # fmt: skip
    return sum((ROOT / p).stat().st_size for p in listed.decode().split("\0") if p and (ROOT / p).is_file())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python-version", default="3.12", help="the device's Python (default 3.12)")
    parser.add_argument("--dest", type=Path, default=ROOT / ".whl", help="kit folder (default: .whl/)")
    parser.add_argument("--image", type=Path, default=ROOT / "scripts" / "gpu_image_packages.txt")
    args = parser.parse_args(argv)
    image = read_list(args.image)
    needed, pinned = closure(args.python_version, image)
    carry = {n: v for n, v in sorted(needed.items()) if n not in image or n in pinned}
    carry.pop("wattserve", None)
    if args.dest.exists():
        shutil.rmtree(args.dest)
    args.dest.mkdir(parents=True)
    print(f"wattserve needs {len(needed)} distributions; the image has {len(needed) - len(carry)}; "
          f"carrying {len(carry)} for Python {args.python_version}:")  # fmt: skip
    manifest: dict[str, dict[str, object]] = {}
    for name, version in carry.items():
        wheel = download(name, version, args.dest, args.python_version)
        manifest[name] = {"version": version, "wheel": wheel.name, "bytes": wheel.stat().st_size}
        print(f"  {name}=={version}  {wheel.name}  {wheel.stat().st_size / 2**10:.0f} KiB")
    leftovers = [p for p in (ROOT / "build", ROOT / "wattserve.egg-info") if not p.exists()]
    built = pip("wheel", "--no-deps", "--no-build-isolation", "-w", str(args.dest), str(ROOT))
    for path in leftovers:  # setuptools builds in the tree: leave it as it was
        shutil.rmtree(path, ignore_errors=True)
    if built.returncode != 0:
        raise SystemExit(f"building the wattserve wheel failed:\n{built.stderr[-3000:]}")
    own = next(args.dest.glob("wattserve-*.whl"))
    manifest["wattserve"] = {"version": "local", "wheel": own.name, "bytes": own.stat().st_size}
    print(f"  wattserve (this tree)  {own.name}  {own.stat().st_size / 2**10:.0f} KiB")
    kit = sum(p.stat().st_size for p in args.dest.glob("*.whl"))
    tree = tree_bytes()
    summary = {"python_version": args.python_version, "platforms": PLATFORMS, "kit_bytes": kit,
               "tree_bytes": tree, "wheels": manifest}  # fmt: skip
    (args.dest / "KIT.json").write_text(json.dumps(summary, indent=2))
    print(f"kit {kit / 2**20:.1f} MiB + working tree {tree / 2**20:.1f} MiB = "
          f"{(kit + tree) / 2**20:.1f} MiB of the {CARRY_LIMIT / 2**20:.0f} MiB carry limit")  # fmt: skip
    if kit + tree > CARRY_LIMIT:
        print("ERROR: over the carry limit", file=sys.stderr)
        return 1
    print(f"device: python3 -m pip install --no-index --find-links {args.dest.name} wattserve")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
