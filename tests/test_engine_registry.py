"""engines/registry.py: built-in models and engines are found by name, in one table each."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest
from wattserve.engines.identity import IdentityEngine
from wattserve.engines.registry import ENGINES, MODELS, TORCHVISION_MODELS, build_engine
from wattserve.server.engine_commands import add_engine_commands
from wattserve.server.settings import EngineName, Settings


def test_the_settings_offer_exactly_the_registered_engines():
    assert set(typing.get_args(EngineName)) == set(ENGINES)


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_identity_is_served_whatever_engine_is_named(engine):
    built = build_engine(
        Settings(model="identity", engine=engine, identity_elements=5, max_batch_size=3).engine_config()
    )
    assert isinstance(built, IdentityEngine)
    assert built.max_batch_size == 3 and built.inputs[0].shape == (5,)


def test_an_unknown_model_names_the_built_ins():
    with pytest.raises(ValueError, match="no torch engine for model 'nope'; models: identity, resnet50"):
        build_engine(Settings(model="nope", engine="torch").engine_config())


def test_every_torchvision_model_is_a_built_in_and_exportable():
    import argparse

    assert set(TORCHVISION_MODELS) < set(MODELS)
    parser = argparse.ArgumentParser()
    add_engine_commands(parser.add_subparsers(dest="command"))
    for name in TORCHVISION_MODELS:
        assert parser.parse_args(["export", "--model", name]).model == name
    with pytest.raises(SystemExit):
        parser.parse_args(["export", "--model", "identity"])
    build = parser.parse_args(["build-engine"])  # builds where `wattserve serve` looks
    assert (build.cache_dir, build.profiles) == (Path(".cache/wattserve"), "1:1:1,2:4:8,8:16:32")
