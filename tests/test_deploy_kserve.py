"""The KServe resources in deploy/kserve against KServe's own API models (the ``kserve`` SDK).

The SDK pins protobuf < 7 and more, which clash with this project's environment, so it lives
in its own virtual environment: ``WATTSERVE_KSERVE_PYTHON`` names its interpreter (.ci/run
creates it). Without it the test is skipped, except under CI=true, where it fails.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.deploy_support import KUSTOMIZATIONS, by_kind, render

CHECKER = Path(__file__).with_name("kserve_sdk_check.py")


def kserve_python() -> str:
    python = os.environ.get("WATTSERVE_KSERVE_PYTHON", "")
    if not python or not Path(python).exists():
        message = "WATTSERVE_KSERVE_PYTHON does not name an interpreter with the kserve SDK"
        if os.environ.get("CI") == "true":
            pytest.fail(message + "; CI must run the KServe schema check")
        pytest.skip(message)
    return python


def sdk_problems(resources: list[dict]) -> list[list[str]]:
    out = subprocess.run(
        [kserve_python(), str(CHECKER)],
        input=json.dumps(resources),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)["problems"]


@pytest.fixture(scope="module")
def kserve_resources() -> list[dict]:
    return render(KUSTOMIZATIONS["kserve"])


def test_kserve_resources_match_the_sdk_models(kserve_resources):
    problems = sdk_problems(kserve_resources)
    assert problems == [[] for _ in kserve_resources]


def test_the_check_catches_a_misspelt_field_a_wrong_type_and_a_missing_name(kserve_resources):
    res = by_kind(copy.deepcopy(kserve_resources))
    isvc = res["InferenceService", "mobilenet-v2"]
    isvc["spec"]["predictor"]["containerConcurency"] = isvc["spec"]["predictor"].pop("containerConcurrency")
    runtime = res["ClusterServingRuntime", "wattserve"]
    runtime["spec"]["protocolVersions"] = "v2"  # a string, not a list
    del runtime["spec"]["containers"][0]["name"]  # a container needs a name
    isvc_problems, runtime_problems = sdk_problems([isvc, runtime])
    assert any("containerConcurency: unknown field" in p for p in isvc_problems)
    assert any("protocolVersions: expected a list" in p for p in runtime_problems)
    # kubernetes client >= 35 models are pydantic ("Field required"); older ones raise "must not be None"
    assert any(
        "containers[0]" in p and "name" in p and ("required" in p or "None" in p) for p in runtime_problems
    )
