"""Nothing in a Triton config is dropped in silence: every field of ``ModelConfig`` is either
honoured (``HONOURED`` in server/models/repository/config.py) or refused at load naming it, unless
``--allow-unsupported-config`` (then cleared, with a warning, so the model and ``/config``
see exactly what runs)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import tritonclient.grpc as tgrpc
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from wattserve.server.models.repository import model_config_pb2 as pb
from wattserve.server.models.repository.config import (
    HONOURED,
    ConfigError,
    check_supported,
    honoured,
    parse_config,
    unhonoured_fields,
)
from wattserve.server.models.repository.plan import plan_config
from wattserve.server.settings import Settings

from tests.servers import free_port, threaded_server

BASE = """backend: "wattserve"
max_batch_size: 4
parameters { key: "builtin" value: { string_value: "identity" } }
parameters { key: "identity_elements" value: { string_value: "4" } }
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
Chain = tuple[FieldDescriptor, ...]


def is_map(field: FieldDescriptor) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


def leaves(message: Descriptor, chain: Chain = ()) -> Iterator[Chain]:
    """Every path from ModelConfig to a scalar (or an empty message), through nested
    messages and map values; a message already on the path ends it (no recursion)."""
    for field in message.fields:
        target = field.message_type
        if is_map(field):
            target = target.fields_by_name["value"].message_type
        here = (*chain, field)
        if target is None or not target.fields or any(f.message_type is target for f in chain):
            yield here
        else:
            yield from leaves(target, here)


def sample(field: FieldDescriptor) -> object:
    """A value that is not the field's default (so protobuf keeps it as set)."""
    if field.type == FieldDescriptor.TYPE_ENUM:
        values = field.enum_type.values
        return values[1].number if len(values) > 1 else values[0].number
    return {
        FieldDescriptor.CPPTYPE_BOOL: True,
        FieldDescriptor.CPPTYPE_STRING: "x" if field.type == FieldDescriptor.TYPE_STRING else b"x",
        FieldDescriptor.CPPTYPE_FLOAT: 1.0,
        FieldDescriptor.CPPTYPE_DOUBLE: 1.0,
    }.get(field.cpp_type, 1)


def set_leaf(message: Message, chain: Chain) -> None:
    field, rest = chain[0], chain[1:]
    if is_map(field):
        entry = field.message_type
        key, value = entry.fields_by_name["key"], entry.fields_by_name["value"]
        container = getattr(message, field.name)
        if value.message_type is None:
            container[sample(key)] = sample(value)
            return
        child = container[sample(key)]
    elif field.message_type is not None:
        container = getattr(message, field.name)
        child = (container[0] if len(container) else container.add()) if field.is_repeated else container
    elif field.is_repeated:
        getattr(message, field.name).append(sample(field))
        return
    else:
        setattr(message, field.name, sample(field))
        return
    if rest:
        set_leaf(child, rest)
    else:
        child.SetInParent()


def expected_refusal(chain: Chain) -> str | None:
    """The path ``unhonoured_fields`` names for a config that sets ``chain``'s leaf (None:
    every field on the way is honoured) in BASE, a built-in model."""
    parts, parent = [], "ModelConfig"
    for field in chain:
        if field.name not in honoured(parent, "builtin"):
            return ".".join([*parts, field.name])  # the refused field as a whole
        repeated = field.is_repeated and field.message_type is not None and not is_map(field)
        parts.append(field.name + ("[0]" if repeated else ""))
        if is_map(field):
            return None  # a map wattserve honours takes its entries whole (parameters)
        if field.message_type is not None:
            parent = field.message_type.name
    return None


def name_of(chain: Chain) -> str:
    return ".".join(f.name for f in chain)


def test_the_honoured_table_names_only_real_fields():
    """A message name may be several types (ParametersEntry): a field of any of them counts."""
    fields_of: dict[str, set[str]] = {}
    seen: set[str] = set()

    def collect(d: Descriptor) -> None:
        if d.full_name in seen:
            return
        seen.add(d.full_name)
        fields_of.setdefault(d.name, set()).update(d.fields_by_name)
        for f in d.fields:
            if f.message_type is not None:
                collect(f.message_type)

    collect(pb.ModelConfig.DESCRIPTOR)
    for message, fields in HONOURED.items():
        assert message in fields_of, message
        assert fields <= fields_of[message], (message, fields - fields_of[message])


def test_every_field_of_model_config_is_honoured_or_refused_at_load(tmp_path):
    (tmp_path / "m" / "1").mkdir(parents=True)
    honoured_paths, refused = [], []
    for chain in leaves(pb.ModelConfig.DESCRIPTOR):
        config = parse_config(BASE)
        set_leaf(config, chain)
        expected = expected_refusal(chain)
        if expected is None:
            honoured_paths.append(name_of(chain))
            assert unhonoured_fields(config, kind="builtin") == [], name_of(chain)
            continue
        refused.append(name_of(chain))
        with pytest.raises(ConfigError) as err:
            plan_config(tmp_path / "m", Settings(), config, "config.pbtxt")
        assert f"config.pbtxt: '{expected}' is not supported by wattserve (" in str(err.value), name_of(chain)
        assert "--allow-unsupported-config" in str(err.value)
        allowed = parse_config(BASE)
        set_leaf(allowed, chain)
        (plan,) = plan_config(
            tmp_path / "m", Settings(allow_unsupported_config=True), allowed, "config.pbtxt"
        )
        assert any(f"field '{expected}' is not supported" in w for w in plan.warnings), name_of(chain)
        assert unhonoured_fields(plan.config) == []  # cleared: what the model sees is what runs
    # the walk reached the whole proto: the fields the issue names, and the honoured ones
    for field in ("sequence_batching.control_input.control.int32_false_true",
                  "model_repository_agents.agents.name",
                  "input.optional",
                  "input.allow_ragged_batch", "batch_input.kind", "optimization.cuda.graphs",
                  "ensemble_scheduling.step.model_name", "model_transaction_policy.decoupled"):  # fmt: skip
        assert field in refused, field
    for field in ("dynamic_batching.default_queue_policy.timeout_action", "input.format", "input.dims",
                  "instance_group.gpus", "version_policy.specific.versions", "parameters.string_value",
                  "model_warmup.inputs.random_data", "model_warmup.count",
                  "dynamic_batching.priority_queue_policy.timeout_action", "dynamic_batching.preserve_ordering",
                  "response_cache.enable", "instance_group.rate_limiter.resources.global",
                  "instance_group.rate_limiter.priority"):  # fmt: skip
        assert field in honoured_paths, field
    assert len(refused) + len(honoured_paths) > 120


def test_kind_model_instances_are_refused_by_value(tmp_path):
    (tmp_path / "m").mkdir()
    config = parse_config(BASE + "instance_group [ { kind: KIND_CPU }, { kind: KIND_MODEL } ]")
    with pytest.raises(ConfigError, match=r"'instance_group\[1\]\.kind' is not supported .*KIND_MODEL"):
        plan_config(tmp_path / "m", Settings(), config, "config.pbtxt")
    (plan,) = plan_config(tmp_path / "m", Settings(allow_unsupported_config=True), config, "config.pbtxt")
    assert plan.serving.devices == ("cpu", Settings().device)  # the second group: KIND_AUTO


def test_fields_honoured_by_one_kind_of_model_only():
    decoupled = parse_config(BASE + "model_transaction_policy { decoupled: true }")
    assert check_supported(decoupled, "python", "c", allow=False) == []
    with pytest.raises(ConfigError, match="'model_transaction_policy' is not supported"):
        check_supported(decoupled, "onnx", "c", allow=False)
    ensemble = parse_config('platform: "ensemble"\nensemble_scheduling { step [ { model_name: "a" '
                            'model_version: -1 input_map { key: "I" value: "x" } output_map { key: "O" '
                            'value: "y" } } ] max_inflight_requests: 2 }')  # fmt: skip
    with pytest.raises(ConfigError) as err:
        check_supported(ensemble, "ensemble", "c", allow=False)
    assert "'ensemble_scheduling.max_inflight_requests' is not supported" in str(err.value)
    assert str(err.value).count("is not supported") == 1  # the steps' fields are honoured


def test_ragged_batching_is_honoured_by_the_engines_that_run_it_and_refused_by_the_others():
    """allow_ragged_batch and every batch_input field: ONNX Runtime, TorchScript and Python
    models (tests/test_ragged_batching.py); a built-in or TensorRT model refuses both, by name."""
    ragged = parse_config(BASE.replace("dims: [ 4 ] } ]\noutput", "dims: [ 4 ] allow_ragged_batch: true } ]\n"
                                       "output", 1) + 'batch_input [ { kind: BATCH_ITEM_SHAPE '
                          'target_name: "S" data_type: TYPE_INT32 source_input: "INPUT0" } ]')  # fmt: skip
    for kind in ("onnx", "torchscript", "python"):
        assert check_supported(ragged, kind, "c", allow=False) == [], kind
    for kind in ("builtin", "tensorrt"):
        with pytest.raises(ConfigError) as err:
            check_supported(ragged, kind, "c", allow=False)
        assert "'input[0].allow_ragged_batch' is not supported" in str(err.value)
        assert (
            "'batch_input' is not supported by wattserve (ragged batching is implemented for ONNX "
            "Runtime, TorchScript and Python models only)" in str(err.value)
        )


def test_input_format_is_checked_as_triton_does(tmp_path):
    (tmp_path / "m").mkdir()
    flat = 'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] format: FORMAT_NCHW } ]'
    with pytest.raises(ConfigError, match=r"input\[0\] \(INPUT0\) format FORMAT_NCHW: model input NHWC/NCHW"):
        plan_config(tmp_path / "m", Settings(), parse_config(BASE.split("input [")[0] + flat), "config.pbtxt")
    image = 'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1, 2, 2 ] format: FORMAT_NHWC } ]'
    (plan,) = plan_config(tmp_path / "m", Settings(), parse_config(BASE.split("input [")[0] + image), "c")
    assert plan.config.input[0].format == pb.ModelInput.FORMAT_NHWC and plan.warnings == []


AGENTS = BASE + 'model_repository_agents { agents [ { name: "checksum" } ] }\n'
CACHED = BASE + "optimization { cuda { graphs: true } }\n"


def write(root: Path, name: str, text: str) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(text)


def test_a_refused_model_is_unavailable_with_the_reason_over_http_and_grpc(tmp_path):
    write(tmp_path, "ok", BASE)
    write(tmp_path, "agents", AGENTS)
    port = free_port()
    with threaded_server(Settings(model_repository=tmp_path, telemetry=False, grpc_port=port)) as (url, _):
        reason = "'model_repository_agents' is not supported by wattserve"
        index = {m["name"]: m for m in httpx.post(url + "/v2/repository/index", json={}).json()}
        assert index["agents"]["state"] == "UNAVAILABLE" and reason in index["agents"]["reason"]
        assert index["ok"]["state"] == "READY"
        ready = httpx.get(url + "/v2/models/agents/ready")
        assert ready.status_code == 400 and reason in ready.json()["error"]
        grpc_index = tgrpc.InferenceServerClient(f"127.0.0.1:{port}").get_model_repository_index()
        by_name = {m.name: m for m in grpc_index.models}
        assert by_name["agents"].state == "UNAVAILABLE" and reason in by_name["agents"].reason
        body = {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [[1, 2, 3, 4]]}]}
        assert httpx.post(url + "/v2/models/ok/infer", json=body).status_code == 200  # the others serve


def test_an_explicit_load_of_a_refused_model_fails_with_the_reason(tmp_path):
    write(tmp_path, "agents", AGENTS)
    with threaded_server(
        Settings(model_repository=tmp_path, telemetry=False, model_control_mode="explicit")
    ) as (
        url,
        _,
    ):
        r = httpx.post(url + "/v2/repository/models/agents/load", json={})
        assert r.status_code == 400, r.text
        assert "'model_repository_agents' is not supported by wattserve" in r.json()["error"]


def test_allowed_unsupported_fields_load_without_them_and_config_shows_what_runs(tmp_path):
    write(tmp_path, "cached", CACHED)
    with threaded_server(
        Settings(model_repository=tmp_path, telemetry=False, allow_unsupported_config=True)
    ) as (
        url,
        _,
    ):
        assert httpx.get(url + "/v2/models/cached/ready").status_code == 200
        config = httpx.get(url + "/v2/models/cached/config").json()
        assert "optimization" not in config and config["max_batch_size"] == 4
        body = {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [[1, 2, 3, 4]]}]}
        out = httpx.post(url + "/v2/models/cached/infer", json=body)
        assert out.status_code == 200 and out.json()["outputs"][0]["data"] == [1, 2, 3, 4]
