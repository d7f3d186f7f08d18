"""Typed configuration (issue 23, point 1): the process settings are read once per model into a
``ServingConfig``; engines, batchers and telemetry each receive only their own typed part,
and what ``/config`` and the metrics name is the batcher that actually runs."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import httpx
import pytest
from wattserve.batchers.config import BatchingSpec
from wattserve.batchers.registry import running_policy
from wattserve.engines.catalog import BUILTIN_MODELS, ENGINE_NAMES
from wattserve.engines.config import EngineConfig
from wattserve.engines.registry import ENGINES, MODELS
from wattserve.server.models.serving_config import ServingConfig
from wattserve.server.settings import MODEL_PARAMETERS, Settings
from wattserve.telemetry.service import TelemetryConfig

from tests.diffusion_support import quiet_cpu  # noqa: F401  (autouse fixture)
from tests.servers import threaded_server

ROOT = Path(__file__).resolve().parent.parent
PARTS = (EngineConfig, BatchingSpec, TelemetryConfig)


def test_no_layer_below_the_server_sees_the_settings():
    """batchers/, engines/ and telemetry/ import nothing of server/ and take no ``settings``."""
    for folder in ("batchers", "engines", "telemetry"):
        for path in sorted((ROOT / folder).glob("*.py")):
            text = path.read_text()
            assert "wattserve.server" not in text, path
            assert not re.search(r"\bsettings\s*:\s*Any|\(settings\b|\bSettings\b", text), path


@pytest.mark.parametrize("part", PARTS, ids=lambda p: p.__name__)
def test_each_part_names_its_fields_as_the_settings_do(part):
    """One knob, one name: every field of a part is the WATTSERVE_* setting of that name,
    with the same default (so a part made without settings behaves as the server's)."""
    defaults = Settings()
    for f in fields(part):
        assert f.name in Settings.model_fields, f"{part.__name__}.{f.name} is no setting"
        value = getattr(defaults, f.name)
        made = getattr(part(), f.name)
        assert made == (tuple(value) if isinstance(value, list) else value), f.name


def test_parts_carry_what_the_settings_say_and_nothing_of_the_network():
    settings = Settings(model="identity", host="0.0.0.0", port=9, instances=2, device="cpu", max_batch_size=4,
                        identity_elements=5, batcher="aimd", slo_ms=40, preferred_batch_sizes=[2, 4],
                        default_priority_level=0, priority_levels=3, default_timeout_ms=20,
                        telemetry_interval_ms=50, gpus=[1])  # fmt: skip
    serving = ServingConfig.from_settings(settings)
    assert serving.engine == EngineConfig(
        model="identity", device="cpu", max_batch_size=4, identity_elements=5
    )
    assert serving.batching.batcher == "aimd" and serving.batching.slo_ms == 40
    assert serving.batching.preferred_batch_sizes == (2, 4)  # immutable: the config is shared
    assert serving.devices == ("cpu", "cpu")
    assert serving.queue.default_priority == 3  # Triton: level 0 means the lowest
    assert serving.queue.default_timeout_ms == 20
    assert settings.telemetry_config() == TelemetryConfig(telemetry_interval_ms=50, gpus=(1,))
    for part in (serving, serving.engine, serving.batching, serving.queue):
        names = {f.name for f in fields(part)}
        assert not names & {"host", "port", "grpc_port", "api_token"}, type(part).__name__
    assert serving.engine.on("cuda:1").device == "cuda:1" and serving.engine.on("cpu") is serving.engine


def test_model_and_engine_names_have_one_home():
    assert tuple(MODELS) == BUILTIN_MODELS and tuple(ENGINES) == ENGINE_NAMES
    assert all(name in Settings.model_fields["model"].description for name in BUILTIN_MODELS)


def test_the_settings_a_model_may_set_are_marked_on_their_fields():
    """The per-model parameters of a config.pbtxt: the 24 from before they moved onto the
    fields, adaptive_unit, max_queue_wait_s (a repository model's own time bound), the
    language-model engine's lm_* and a Python model's isolation and execute timeout (a field
    that loses its mark would silently stop being a model parameter)."""
    assert {
        "batcher", "engine", "weights", "seed", "fp16", "channels_last", "identity_elements",
        "identity_delay_ms", "torch_threads", "cuda_graphs", "engine_batch_sizes", "batch_sizes_only",
        "trt_profiles", "onnx_path", "diffusion_model", "diffusion_scheduler", "diffusion_default_steps",
        "check_values", "warmup",
        "identity_delay_per_item_ms", "slo_ms", "slo_percentile", "slo_headroom_ms", "slo_reject",
        "adaptive_unit", "slo_late_last", "max_queue_wait_s", "flush_denormal",
        "lm_kv_blocks", "lm_block_size", "lm_token_budget", "lm_chunked_prefill", "lm_default_max_tokens",
        "lm_dtype", "python_model_isolation", "python_execute_timeout_s",
    } == MODEL_PARAMETERS  # fmt: skip


def test_the_policy_that_runs_is_named_once():
    assert running_policy("continuous", step_engine=True) == "iteration"
    assert running_policy("continuous", step_engine=False) == "continuous"
    assert running_policy("dynamic", step_engine=True) == "dynamic"
    step = ServingConfig.from_settings(Settings(model="tiny_unet", batcher="continuous"))
    assert step.steps and step.policy == "iteration"
    assert (
        ServingConfig.from_settings(Settings(model="identity", batcher="continuous")).policy == "continuous"
    )


@pytest.mark.slow
def test_config_and_metrics_name_the_batcher_that_runs():
    """continuous on a step engine runs iteration-level batching: /config and every metric
    say iteration (they said continuous)."""
    settings = Settings(model="tiny_unet", batcher="continuous", max_batch_size=2, torch_threads=1,
                        warmup=False, telemetry=False, log_level="warning")  # fmt: skip
    with threaded_server(settings) as (url, app):
        assert app.state.runtime.batcher.name == "iteration"
        config = httpx.get(f"{url}/v2/models/tiny_unet/config").json()
        assert config["parameters"]["batcher"] == {"string_value": "iteration"}
        assert config["parameters"]["wattserve_batcher"] == {"string_value": "iteration"}
        assert config["max_batch_size"] == 2 and "dynamic_batching" not in config
        metrics = httpx.get(f"{url}/metrics").text
        labelled = re.findall(r'^wattserve_\w+\{[^}]*batcher="(\w+)"', metrics, re.M)
        assert labelled and set(labelled) == {"iteration"}
