"""Check KServe resources against the KServe Python SDK's published API models, strictly.

Runs in its own interpreter with only ``kserve`` installed (its pins, e.g. protobuf < 7,
clash with the project's environment), so tests/test_deploy_kserve.py starts it as a
subprocess: resources as a JSON list on stdin, one list of problems per resource on stdout.

The SDK's models are generated from KServe's OpenAPI spec: each has ``openapi_types`` (field
-> type) and ``attribute_map`` (field -> JSON key), and nested Kubernetes types come from the
``kubernetes`` client's models. Every key must be a known field of its model (a misspelt
field fails, as the API server's strict field validation would), every value must have the
declared type, and each model is constructed so the SDK's own required-field and enum
checks run.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

import kserve
import kubernetes.client

KINDS = {
    ("serving.kserve.io/v1beta1", "InferenceService"): "V1beta1InferenceService",
    ("serving.kserve.io/v1alpha1", "ServingRuntime"): "V1alpha1ServingRuntime",
    ("serving.kserve.io/v1alpha1", "ClusterServingRuntime"): "V1alpha1ClusterServingRuntime",
}
PRIMITIVES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
    "datetime": (str,),
    "date": (str,),
}


def model_class(name: str) -> type:
    cls = getattr(kserve, name, None) or getattr(kubernetes.client, name, None)
    if cls is None:
        raise LookupError(f"no SDK model named {name}")
    return cls


def check(value: Any, type_str: str, path: str, problems: list[str]) -> None:
    if type_str == "object":
        return
    # kserve's models write list[X] / dict(str, X); the kubernetes client's List[X] / Dict[str, X]
    if m := re.fullmatch(r"[Ll]ist\[(.+)\]", type_str):
        if not isinstance(value, list):
            problems.append(f"{path}: expected a list, got {type(value).__name__}")
            return
        for i, item in enumerate(value):
            check(item, m.group(1), f"{path}[{i}]", problems)
        return
    if m := re.fullmatch(r"dict\(str, (.+)\)|Dict\[str, (.+)\]", type_str):
        if not isinstance(value, dict):
            problems.append(f"{path}: expected a map, got {type(value).__name__}")
            return
        for key, item in value.items():
            check(item, m.group(1) or m.group(2), f"{path}.{key}", problems)
        return
    if type_str in PRIMITIVES:
        ok = isinstance(value, PRIMITIVES[type_str]) and not (type_str == "int" and isinstance(value, bool))
        if not ok:
            problems.append(f"{path}: expected {type_str}, got {type(value).__name__} {value!r}")
        return
    cls = model_class(type_str)
    if not isinstance(value, dict):
        problems.append(f"{path}: expected a {type_str} object, got {type(value).__name__}")
        return
    by_key = {json_key: attr for attr, json_key in cls.attribute_map.items()}
    kwargs = {}
    for key, item in value.items():
        attr = by_key.get(key)
        if attr is None:
            problems.append(f"{path}.{key}: unknown field of {type_str}")
            continue
        check(item, cls.openapi_types[attr], f"{path}.{key}", problems)
        kwargs[attr] = item
    try:
        cls(**kwargs)  # the SDK's required-field and allowed-value checks
    except (ValueError, TypeError) as exc:
        problems.append(f"{path}: {type_str}: {exc}")


def check_resource(res: dict[str, Any]) -> list[str]:
    name = KINDS.get((res.get("apiVersion"), res.get("kind")))
    if name is None:
        return [f"not a KServe kind this check knows: {res.get('apiVersion')} {res.get('kind')}"]
    problems: list[str] = []
    check(res, name, res["kind"], problems)
    return problems


def main() -> int:
    resources = json.load(sys.stdin)
    json.dump({"kserve": kserve.__version__ if hasattr(kserve, "__version__") else "unknown",
               "problems": [check_resource(r) for r in resources]}, sys.stdout)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
