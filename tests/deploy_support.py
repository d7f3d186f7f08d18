"""Render the kustomizations in deploy/ without the kustomize binary (CI has none).

Covers exactly the kustomize features deploy/ uses, and refuses anything else, so a new
feature cannot be silently ignored: ``resources`` (files and folders), ``labels`` (metadata
only), ``images``, ``configMapGenerator`` (files, labels, no name hash) and JSON 6902
``patches`` with a target. Where a kustomize binary exists (``kubectl kustomize``), the tests
compare this rendering with its output.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonpatch
import yaml

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
KUSTOMIZATIONS = {
    "k8s-base": DEPLOY / "k8s" / "base",
    "k8s-gpu": DEPLOY / "k8s" / "overlays" / "gpu",
    "kserve": DEPLOY / "kserve",
}
KNOWN_KEYS = {"apiVersion", "kind", "resources", "labels", "images", "configMapGenerator", "patches"}

Resource = dict[str, Any]


def load_yaml_docs(path: Path) -> list[Resource]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def render(folder: Path) -> list[Resource]:
    """The resources ``kubectl kustomize folder`` would print (order aside)."""
    k = yaml.safe_load((folder / "kustomization.yaml").read_text())
    unknown = set(k) - KNOWN_KEYS
    if unknown:
        raise NotImplementedError(f"{folder}: kustomize features not rendered here: {sorted(unknown)}")
    out: list[Resource] = []
    for entry in k.get("resources", []):
        path = (folder / entry).resolve()
        out.extend(render(path) if path.is_dir() else load_yaml_docs(path))
    for gen in k.get("configMapGenerator", []):
        out.append(_config_map(folder, gen))
    for patch in k.get("patches", []):
        _apply_patch(folder, patch, out)
    for image in k.get("images", []):
        _set_image(out, image)
    for entry in k.get("labels", []):
        if entry.get("includeSelectors") or entry.get("includeTemplates"):
            raise NotImplementedError("labels on selectors/templates are not rendered here")
        for res in out:
            res.setdefault("metadata", {}).setdefault("labels", {}).update(entry["pairs"])
    return out


def _config_map(folder: Path, gen: dict[str, Any]) -> Resource:
    options = gen.get("options", {})
    if not options.get("disableNameSuffixHash"):
        raise NotImplementedError("configMapGenerator name hashes are not rendered here")
    if set(gen) - {"name", "files", "options"}:
        raise NotImplementedError(f"configMapGenerator keys {sorted(set(gen))}")
    data = {}
    for f in gen.get("files", []):
        key, _, rel = f.partition("=") if "=" in f else (Path(f).name, "", f)
        data[key] = (folder / rel).read_text()
    meta: dict[str, Any] = {"name": gen["name"]}
    if options.get("labels"):
        meta["labels"] = dict(options["labels"])
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}


def _matches(res: Resource, target: dict[str, Any]) -> bool:
    group, _, version = res["apiVersion"].rpartition("/")
    checks = {"kind": res["kind"], "name": res["metadata"]["name"], "group": group, "version": version}
    return all(checks[key] == value for key, value in target.items())


def _apply_patch(folder: Path, patch: dict[str, Any], resources: list[Resource]) -> None:
    ops = yaml.safe_load((folder / patch["path"]).read_text())
    if not isinstance(ops, list):
        raise NotImplementedError("only JSON 6902 patches (a list of operations) are rendered here")
    hits = [i for i, r in enumerate(resources) if _matches(r, patch["target"])]
    if not hits:
        raise ValueError(f"patch {patch['path']} matches no resource")
    for i in hits:
        resources[i] = jsonpatch.apply_patch(copy.deepcopy(resources[i]), ops)


def _containers(res: Resource) -> list[dict[str, Any]]:
    spec = res.get("spec", {})
    pod = spec.get("template", {}).get("spec", spec)
    return [*pod.get("containers", []), *pod.get("initContainers", [])]


def _set_image(resources: list[Resource], image: dict[str, Any]) -> None:
    for res in resources:
        for c in _containers(res):
            name, _, _tag = c.get("image", "").partition(":")
            if name == image["name"]:
                c["image"] = f"{image.get('newName', name)}:{image['newTag']}"


def by_kind(resources: list[Resource]) -> dict[tuple[str, str], Resource]:
    return {(r["kind"], r["metadata"]["name"]): r for r in resources}


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def pod_spec(res: Resource) -> dict[str, Any]:
    return res["spec"]["template"]["spec"]
