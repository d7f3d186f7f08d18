"""Batchers are found by their own ``name``: the registry, the settings and the study
schema all take the list of names from the classes, and each config comes from the batching part of Settings."""

from __future__ import annotations

import typing

import pytest
from pydantic import ValidationError
from wattserve.batchers.adaptive import AdaptiveBatcher, AdaptiveConfig
from wattserve.batchers.aimd import AimdBatcher, AimdConfig
from wattserve.batchers.base import Batcher
from wattserve.batchers.dynamic import DynamicBatcher, DynamicConfig
from wattserve.batchers.registry import BATCHER_NAMES, POLICIES, batcher_help, build_batcher
from wattserve.batchers.static import StaticBatcher
from wattserve.loadgen.study import Batching
from wattserve.server.settings import Settings

from tests.gated_engine import GatedEngine


def all_policies(cls: type = Batcher) -> set[type]:
    found = set()
    for sub in cls.__subclasses__():
        found |= {sub, *all_policies(sub)}
    return {c for c in found if "name" in c.__dict__}  # concrete policies name themselves


def test_every_policy_is_registered_under_its_own_name():
    assert set(POLICIES.values()) >= all_policies()
    for name, cls in POLICIES.items():
        assert cls.name == name
        assert cls.summary and cls.summary in batcher_help()


def test_settings_and_study_schema_take_the_names_from_the_registry():
    assert typing.get_args(Settings.model_fields["batcher"].annotation) == BATCHER_NAMES
    assert typing.get_args(Batching.model_fields["batcher"].annotation) == BATCHER_NAMES
    assert Settings.model_fields["batcher"].description == batcher_help()
    with pytest.raises(ValidationError):
        Settings(batcher="fastest")


def test_each_policy_reads_its_own_settings():
    engine = GatedEngine(batch_sizes=[1, 2, 4])
    settings = Settings(
        model="identity", batcher="dynamic", max_batch_size=4, max_queue_size=9, priority_levels=2, max_queue_wait_s=2.5,
        max_queue_delay_ms=7, preferred_batch_sizes=[2], batch_sizes_only=True,
        slo_ms=40, slo_percentile=95, slo_headroom_ms=3, slo_reject=True, slo_late_last=False,
    )  # fmt: skip
    dynamic = build_batcher(settings.batching_spec(), [engine])
    assert isinstance(dynamic, DynamicBatcher)
    assert dynamic.config == DynamicConfig(
        max_batch_size=4, max_queue_size=9, priority_levels=2, max_queue_wait_s=2.5, max_queue_delay_s=0.007,
        preferred_batch_sizes=(2,), allowed_sizes=(1, 2, 4),
    )  # fmt: skip
    adaptive = build_batcher(settings.model_copy(update={"batcher": "adaptive"}).batching_spec(), [engine])
    assert isinstance(adaptive, AdaptiveBatcher)
    assert adaptive.config == AdaptiveConfig(
        max_batch_size=4, max_queue_size=9, priority_levels=2, max_queue_wait_s=2.5, slo_s=0.04,
        percentile=95, headroom_s=0.003, reject_late=True, late_last=False,
    )  # fmt: skip
    aimd = build_batcher(settings.model_copy(update={"batcher": "aimd"}).batching_spec(), [engine])
    assert isinstance(aimd, AimdBatcher)
    assert aimd.config == AimdConfig(max_batch_size=4, max_queue_size=9, priority_levels=2,
                                     max_queue_wait_s=2.5, slo_s=0.04, percentile=95)  # fmt: skip
    static = build_batcher(settings.model_copy(update={"batcher": "static"}).batching_spec(), [engine])
    assert type(static) is StaticBatcher and static.config.max_batch_size == 4


@pytest.mark.parametrize("name", ["adaptive", "aimd"])
def test_slo_policies_publish_one_collector_labelled_by_the_server(name):
    engine = GatedEngine()
    batcher = build_batcher(Settings(model="identity", batcher=name, slo_ms=50).batching_spec(), [engine])
    batcher.slo.met, batcher.slo.missed = 3, 1
    families = {f.name: f for f in batcher.collector("my_model").collect()}
    (objective,) = families["wattserve_slo_objective_seconds"].samples
    assert objective.labels == {"model": "my_model", "batcher": name, "percentile": "99"}
    assert objective.value == 0.05
    counts = {s.labels["result"]: s.value for s in families["wattserve_slo_requests"].samples}
    assert counts == {"met": 3, "missed": 1, "rejected": 0}
    own = "wattserve_adaptive_target_batch_size" if name == "adaptive" else "wattserve_aimd_batch_size_limit"
    assert own in families  # and the policy's own gauges beside them


def test_request_level_policies_have_no_collector():
    assert (
        build_batcher(
            Settings(model="identity", batcher="dynamic").batching_spec(), [GatedEngine()]
        ).collector("m")
        is None
    )
