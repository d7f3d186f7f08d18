"""Triton's sequence batcher (``sequence_batching``, direct) against the shape of Triton's QA
sequence models: an accumulator that gets INPUT and the START, READY and CORRID control
tensors (support/sequence_models.py): ONNX with implicit state, and a Python model that keeps
a sum per ``request.correlation_id()``.

Several sequences from concurrent clients over HTTP and gRPC, every running sum checked; one
sequence's requests pipelined on a gRPC stream still run one at a time and in order (the
Python model fails a request whose sequence has another in the same ``execute``); a request
without a sequence ID, or one whose sequence never started or was released idle, is refused
with Triton's words; START/END are the flags a Python model sees."""

from __future__ import annotations

import asyncio
import queue
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from types import SimpleNamespace

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException
from wattserve.batchers.config import BatchingSpec
from wattserve.batchers.sequence import DelayHook, SequenceBatcher, SequenceConfig
from wattserve.batchers.sequence_slots import SequenceNotStarted, Sequences
from wattserve.batchers.types import ClientGone, SequenceTag, WorkItem
from wattserve.server.models.repository.config import ConfigError, parse_config
from wattserve.server.models.repository.plan import plan_model
from wattserve.server.models.repository.sequence_config import sequence_spec
from wattserve.server.models.repository.sequence_plan import BACKLOG_VARIABLE, DELAY_VARIABLE, delay_hook
from wattserve.server.settings import Settings

from support.sequence_models import (
    ensemble_over,
    onnx_accumulator,
    python_accumulator,
    torchscript_accumulator,
)
from tests.fake_clock import FakeClock, settle
from tests.gated_engine import GatedEngine, item_input
from tests.servers import free_port, threaded_server

MODELS = ("acc_onnx", "acc_python", "acc_oldest", "acc_torchscript", "acc_two", "acc_py_two")
PYTHON_MODELS = ("acc_python", "acc_idle", "acc_py_two")  # string correlation IDs, flags seen
OLDEST = (
    "oldest { max_candidate_sequences: 8 preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 2000 }"
)
LENGTH = 5


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("sequence_repo")
    onnx_accumulator(root)
    python_accumulator(root)
    python_accumulator(root, "acc_idle", idle_us=200_000)
    onnx_accumulator(root, "acc_oldest", strategy=OLDEST)
    torchscript_accumulator(root)
    ensemble_over(root, "acc_onnx")
    # two instances: a sequence is pinned to its slot's instance, where its state lives (a
    # Python model's in the instance itself: a request run elsewhere would start from 0)
    for two in (onnx_accumulator(root, "acc_two"), python_accumulator(root, "acc_py_two")):
        (two / "config.pbtxt").write_text(
            (two / "config.pbtxt").read_text().replace("count: 1 kind", "count: 2 kind")
        )
    port = free_port()
    with threaded_server(Settings(model_repository=root, telemetry=False, grpc_port=port)) as (url, app):
        yield url.removeprefix("http://"), f"127.0.0.1:{port}", app


def wait_for(predicate, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.01)


def one_input(module, value: int):
    tensor = module.InferInput("INPUT", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[value]], np.int32))
    return tensor


def step(protocol: str, address: str, model: str, value: int, cid, start: bool, end: bool) -> dict:
    """One request of a sequence; its outputs by name."""
    module = thttp if protocol == "http" else tgrpc
    client = module.InferenceServerClient(address)
    result = client.infer(model, [one_input(module, value)], sequence_id=cid, sequence_start=start,
                          sequence_end=end)  # fmt: skip
    onnx = model not in PYTHON_MODELS
    names = ["OUTPUT", "CORRID_OUT"] if onnx else ["OUTPUT", "FLAGS", "START_SEEN", "CORRID_SEEN"]
    return {name: result.as_numpy(name)[0, 0] for name in names}


def correlation_id(model: str, i: int):
    """uint64 IDs (some past 2^32) for the ONNX and TorchScript models (their CORRID is
    TYPE_UINT64, TYPE_INT64), strings for the Python model's TYPE_STRING CORRID."""
    return f"seq-{i}" if model in PYTHON_MODELS else (i + 1) * 1_000_003_007


@pytest.mark.parametrize("model", MODELS)
def test_interleaved_sequences_from_concurrent_clients_over_http_and_grpc(served, model):
    http_address, grpc_address, _ = served
    sequences = 4  # one per batch slot (max_batch_size 4): a fifth would wait for a slot, and its round
    barrier = threading.Barrier(sequences)  # every client sends its k-th request in the same round
    rng = np.random.default_rng(1)
    values = rng.integers(-50, 50, size=(sequences, LENGTH))

    def client(i: int) -> list[dict]:
        protocol, address = ("http", http_address) if i % 2 else ("grpc", grpc_address)
        answers = []
        for k in range(LENGTH):
            barrier.wait(timeout=60)
            answers.append(step(protocol, address, model, int(values[i, k]), correlation_id(model, i),
                                k == 0, k == LENGTH - 1))  # fmt: skip
        return answers

    with ThreadPoolExecutor(sequences) as pool:
        results = list(pool.map(client, range(sequences)))
    for i, answers in enumerate(results):
        assert [int(a["OUTPUT"]) for a in answers] == np.cumsum(values[i]).tolist(), i
        if model in PYTHON_MODELS:  # the flags and control tensors the model saw
            assert [int(a["FLAGS"]) for a in answers] == [1, 0, 0, 0, 2]
            assert [int(a["START_SEEN"]) for a in answers] == [1, 0, 0, 0, 0]
            assert {a["CORRID_SEEN"] for a in answers} == {correlation_id(model, i).encode()}
        else:
            assert {int(a["CORRID_OUT"]) for a in answers} == {correlation_id(model, i)}


def test_more_sequences_than_slots_wait_for_one_and_all_complete(served):
    """Ten concurrent sequences on four slots (max_batch_size 4, one instance): the six that
    start while every slot is taken wait in start order for one to end, none is refused."""
    http_address, grpc_address, _ = served

    def client(i: int) -> list[int]:
        protocol, address = ("http", http_address) if i % 2 else ("grpc", grpc_address)
        return [int(step(protocol, address, "acc_python", i + k, f"many-{i}", k == 0, k == 2)["OUTPUT"])
                for k in range(3)]  # fmt: skip

    with ThreadPoolExecutor(10) as pool:
        results = list(pool.map(client, range(10)))
    assert results == [[i, 2 * i + 1, 3 * i + 3] for i in range(10)]


@pytest.mark.parametrize("model", MODELS)
def test_a_sequence_pipelined_on_one_stream_runs_one_request_at_a_time_in_order(served, model):
    """Every request of three sequences sent on one gRPC stream without waiting for answers:
    the Python model fails any request whose sequence shares its execute; every running sum
    comes out right only if each sequence's requests ran in order."""
    _, grpc_address, _ = served
    answers: queue.Queue = queue.Queue()
    client = tgrpc.InferenceServerClient(grpc_address)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    ids = [correlation_id(model, 100 + i) for i in range(3)]
    expected = {}
    try:
        for k in range(LENGTH):
            for n, cid in enumerate(ids):
                value = 10 * n + k + 1
                expected[f"{n}-{k}"] = expected.get(f"{n}-{k - 1}", 0) + value
                client.async_stream_infer(model, [one_input(tgrpc, value)], request_id=f"{n}-{k}",
                                          sequence_id=cid, sequence_start=k == 0,
                                          sequence_end=k == LENGTH - 1)  # fmt: skip
        got = {}
        for _ in range(len(expected)):
            result, error = answers.get(timeout=60)
            assert error is None, error
            got[result.get_response().id] = int(result.as_numpy("OUTPUT")[0, 0])
    finally:
        client.stop_stream()
    assert got == expected


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_request_without_a_sequence_id_is_refused_with_tritons_message(served, protocol):
    http_address, grpc_address, _ = served
    module = thttp if protocol == "http" else tgrpc
    client = module.InferenceServerClient(http_address if protocol == "http" else grpc_address)
    with pytest.raises(InferenceServerException) as refused:
        client.infer("acc_onnx", [one_input(module, 1)])
    assert "inference request to model 'acc_onnx' must specify a non-zero or non-empty correlation ID" in str(
        refused.value
    )
    assert refused.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")


def test_control_inputs_are_not_client_inputs(served):
    http_address, _, _ = served
    meta = httpx.get(f"http://{http_address}/v2/models/acc_onnx").json()
    assert [t["name"] for t in meta["inputs"]] == ["INPUT"]
    assert [t["name"] for t in meta["outputs"]] == ["OUTPUT", "CORRID_OUT"]  # the state output stays inside
    sent = httpx.post(f"http://{http_address}/v2/models/acc_onnx/infer", json={
        "parameters": {"sequence_id": 77, "sequence_start": True, "sequence_end": True},
        "inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "INT32", "data": [9]},
                   {"name": "START", "shape": [1, 1], "datatype": "INT32", "data": [0]}]})  # fmt: skip
    assert sent.status_code == 400  # a control input is the server's to fill


def test_a_request_of_two_rows_is_refused_and_the_config_says_sequence_batching(served):
    http_address, grpc_address, app = served
    two = httpx.post(f"http://{http_address}/v2/models/acc_onnx/infer", json={
        "parameters": {"sequence_id": 78, "sequence_start": True},
        "inputs": [{"name": "INPUT", "shape": [2, 1], "datatype": "INT32", "data": [1, 2]}]})  # fmt: skip
    assert two.status_code == 400
    assert "must specify batch-size 1 due to requirements of sequence batcher" in two.json()["error"]
    config = httpx.get(f"http://{http_address}/v2/models/acc_oldest/config").json()
    assert config["sequence_batching"]["oldest"]["max_candidate_sequences"] == 8
    assert [c["name"] for c in config["sequence_batching"]["control_input"]] == ["START", "READY", "CORRID"]
    assert (
        "dynamic_batching" not in config
        and config["parameters"]["batcher"]["string_value"] == "sequence_oldest"
    )
    two = app.state.models.lookup("acc_two").runtime.batcher
    assert len(two.instances) == 2 and two.sequences.slots == 8  # Triton's: max_batch_size per instance
    over_grpc = tgrpc.InferenceServerClient(grpc_address).get_model_config("acc_onnx").config
    assert over_grpc.sequence_batching.state[0].input_name == "SUM_IN"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_largest_uint64_correlation_id_reaches_the_model(served, protocol):
    """2^64 - 1: HTTP carries it as a JSON integer; gRPC's int64_param as -1 (its bits)."""
    http_address, grpc_address, _ = served
    address = http_address if protocol == "http" else grpc_address
    cid = 2**64 - 1 if protocol == "http" else -1  # tritonclient's gRPC takes an int64
    answer = step(protocol, address, "acc_onnx", 3, cid, start=True, end=True)
    assert int(answer["CORRID_OUT"]) == 2**64 - 1 and int(answer["OUTPUT"]) == 3


def test_a_correlation_id_the_corrid_type_cannot_hold_is_refused(tmp_path):
    text = (onnx_accumulator(tmp_path) / "config.pbtxt").read_text().replace("TYPE_UINT64 }", "TYPE_INT32 }")
    (tmp_path / "acc_onnx" / "config.pbtxt").write_text(text)
    (plan,) = plan_model(tmp_path / "acc_onnx", Settings(telemetry=False))
    with pytest.raises(ValueError, match="does not fit the CORRID control input 'CORRID' \\(TYPE_INT32\\)"):
        plan.serving.sequence.admit(SequenceTag(2**40, start=True), 1, {})
    with pytest.raises(ValueError, match="a string correlation ID"):
        plan.serving.sequence.admit(SequenceTag("abc", start=True), 1, {})


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_an_ensemble_passes_the_sequence_to_its_stateful_step(served, protocol):
    http_address, grpc_address, _ = served
    module = thttp if protocol == "http" else tgrpc
    client = module.InferenceServerClient(http_address if protocol == "http" else grpc_address)

    def value(v: int):
        tensor = module.InferInput("VALUE", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[v]], np.int32))
        return tensor

    cid = 4242 if protocol == "http" else 4343
    sums = [
        int(client.infer("acc_ensemble", [value(v)], sequence_id=cid, sequence_start=k == 0,
                         sequence_end=k == 2).as_numpy("SUM")[0, 0])
        for k, v in enumerate((5, 6, 7))
    ]  # fmt: skip
    assert sums == [5, 11, 18]
    with pytest.raises(InferenceServerException) as refused:
        client.infer("acc_ensemble", [value(1)])
    assert ("in ensemble 'acc_ensemble'" in str(refused.value)
            and "must specify a non-zero or non-empty correlation ID" in str(refused.value))  # fmt: skip


def test_a_sequence_that_did_not_start_is_refused(served):
    http_address, _, _ = served
    with pytest.raises(InferenceServerException, match=(
        "inference request for sequence 31337 to model 'acc_onnx' must specify the START flag on the first "
        "request of the sequence")):  # fmt: skip
        step("http", http_address, "acc_onnx", 1, 31337, start=False, end=False)


def test_an_idle_sequence_is_released_and_a_late_request_refused(served):
    http_address, _, app = served
    batcher = app.state.models.lookup("acc_idle").runtime.batcher
    assert step("http", http_address, "acc_idle", 4, "slow", start=True, end=False)["OUTPUT"] == 4
    assert "slow" in batcher.sequences.live
    wait_for(lambda: "slow" not in batcher.sequences.live)  # max_sequence_idle_microseconds: 200 ms
    assert batcher.sequences.free == batcher.sequences.slots  # its slot is free again
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        step("http", http_address, "acc_idle", 1, "slow", start=False, end=False)
    assert step("http", http_address, "acc_idle", 2, "slow", start=True, end=True)["OUTPUT"] == 2


# ---------------------------------------------------------------- the batcher alone


def sequence_item(value: float, cid, start: bool = False, end: bool = False) -> WorkItem:
    return WorkItem(item_input(value), sequence=SequenceTag(cid, start=start, end=end))


async def test_requests_of_one_sequence_never_share_a_batch_and_run_in_order():
    engine = GatedEngine(max_batch_size=4)
    engine.gate.clear()
    batcher = SequenceBatcher([engine], SequenceConfig(max_batch_size=4))
    runner = asyncio.create_task(batcher.run())
    a = [sequence_item(1 + k, "a", start=k == 0, end=k == 2) for k in range(3)]
    b = [sequence_item(11 + k, "b", start=k == 0, end=k == 2) for k in range(3)]
    tasks = [asyncio.create_task(batcher.submit(it)) for pair in zip(a, b, strict=True) for it in pair]
    await asyncio.sleep(0)
    engine.gate.set()
    await asyncio.gather(*tasks)
    await batcher.drain()
    await runner
    for batch in engine.batches:  # each batch holds at most one request of each sequence
        assert len([v for v in batch if v < 10]) <= 1 and len([v for v in batch if v > 10]) <= 1
    assert [v for v in engine.seen if v < 10] == [1, 2, 3] and [v for v in engine.seen if v > 10] == [
        11,
        12,
        13,
    ]
    assert batcher.sequences.free == 4 and not batcher.sequences.live


async def test_a_sequence_waits_for_a_free_slot_and_gets_the_one_an_ending_sequence_frees():
    engine = GatedEngine(max_batch_size=1)
    batcher = SequenceBatcher([engine], SequenceConfig(max_batch_size=1))
    runner = asyncio.create_task(batcher.run())
    first = asyncio.create_task(batcher.submit(sequence_item(1, 1, start=True)))
    await first
    second = asyncio.create_task(batcher.submit(sequence_item(2, 2, start=True, end=True)))
    for _ in range(20):  # let it run as far as it can: into the backlog, not the engine
        await asyncio.sleep(0)
    assert not second.done() and list(batcher.sequences.backlog)  # no slot: it waits
    await batcher.submit(sequence_item(3, 1, end=True))  # sequence 1 ends: its slot goes to 2
    await second
    assert engine.seen == [1, 3, 2]
    with pytest.raises(SequenceNotStarted):
        await batcher.submit(sequence_item(4, 1))
    await batcher.drain()
    await runner


async def test_a_request_whose_client_left_while_it_waited_its_turn_is_never_computed():
    engine = GatedEngine(max_batch_size=4)
    engine.gate.clear()
    batcher = SequenceBatcher([engine], SequenceConfig(max_batch_size=4))
    runner = asyncio.create_task(batcher.run())
    first = asyncio.create_task(batcher.submit(sequence_item(1, "c", start=True)))
    gone = sequence_item(2, "c")
    waiting = asyncio.create_task(batcher.submit(gone))
    for _ in range(20):
        await asyncio.sleep(0)
    batcher.cancel(gone)  # what the runtime does when the client disconnects
    engine.gate.set()
    await first
    with pytest.raises(ClientGone):
        await waiting
    await batcher.submit(sequence_item(3, "c", end=True))  # the sequence goes on after it
    assert engine.seen == [1, 3] and not batcher.sequences.live
    await batcher.drain()
    await runner
    batcher.close()


# ---------------------------------------------------------------- what is refused at load


@pytest.mark.parametrize(
    ("change", "refused"),
    [
        (lambda t: t.replace("direct {", "oldest { preserve_ordering: true "),
         "'sequence_batching.oldest.preserve_ordering' is not supported"),
        (lambda t: t.replace("dims: [ 1 ]\n", "dims: [ 1 ] use_growable_memory: true\n", 1),
         "'sequence_batching.state[0].use_growable_memory' is not supported"),
        (lambda t: t.replace("zero_data: true", 'data_file: "missing"'), "initial_state/missing"),
        (lambda t: t + 'parameters { key: "batcher" value: { string_value: "dynamic" } }\n',
         "runs on the sequence batcher"),
        (lambda t: t.replace("max_sequence_idle_microseconds", "iterative_sequence: true\n  max_sequence_idle_microseconds"),
         "'sequence_batching.iterative_sequence' is not supported"),
    ],
)  # fmt: skip
def test_what_is_not_implemented_is_refused_at_load_by_name(tmp_path, change, refused):
    folder = onnx_accumulator(tmp_path)
    config = folder / "config.pbtxt"
    config.write_text(change(config.read_text()))
    with pytest.raises(ConfigError, match=re.escape(refused)):
        plan_model(folder, Settings(telemetry=False))


def test_implicit_state_is_refused_for_a_python_model(tmp_path):
    folder = python_accumulator(tmp_path)
    config = folder / "config.pbtxt"
    text = config.read_text().rstrip()
    config.write_text(text.replace("sequence_batching {", 'sequence_batching {\n  state [ { input_name: "S" '
                                   'output_name: "T" data_type: TYPE_INT32 dims: [ 1 ] } ]'))  # fmt: skip
    with pytest.raises(
        ConfigError, match=re.escape("'sequence_batching.state' is not supported by wattserve (implicit")
    ):
        plan_model(folder, Settings(telemetry=False))


def test_a_sequence_model_runs_the_sequence_batcher_whatever_the_environment_names(tmp_path):
    (plan,) = plan_model(onnx_accumulator(tmp_path), Settings(telemetry=False, batcher="dynamic"))
    assert plan.serving.batching.batcher == "sequence"
    assert plan.serving.batching.max_queue_delay_ms == 0.0
    assert plan.serving.batching.sequence_idle_s == 5.0  # type: ignore[attr-defined]


def test_the_oldest_strategy_batches_candidate_sequences_as_dynamic_does(tmp_path):
    (plan,) = plan_model(onnx_accumulator(tmp_path, strategy=OLDEST), Settings(telemetry=False))
    batching = plan.serving.batching
    assert (batching.batcher, batching.preferred_batch_sizes, batching.max_queue_delay_ms) == (
        "sequence_oldest",
        (2,),
        2.0,
    )
    assert batching.slots == 8  # type: ignore[attr-defined]


async def test_oldest_holds_at_most_its_candidate_sequences():
    from wattserve.batchers.sequence_oldest import OldestConfig, OldestSequenceBatcher

    engine = GatedEngine(max_batch_size=4)
    batcher = OldestSequenceBatcher([engine], OldestConfig(max_batch_size=4, slots=2, max_queue_delay_s=0.0))
    runner = asyncio.create_task(batcher.run())
    for cid in (1, 2):
        await batcher.submit(sequence_item(cid, cid, start=True))
    third = asyncio.create_task(batcher.submit(sequence_item(3, 3, start=True, end=True)))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not third.done() and batcher.sequences.free == 0
    await batcher.submit(sequence_item(4, 1, end=True))
    await third
    assert engine.seen == [1, 2, 4, 3]
    await batcher.drain()
    await runner


async def test_oldest_has_candidate_sequences_per_instance_each_pinned_to_its_own():
    """Triton's oldest strategy over two instances: ``max_candidate_sequences`` (here 1) per
    instance, each instance batching its own sequences' requests; a third sequence waits
    for a slot and gets the one that frees, on that slot's instance."""
    from wattserve.batchers.sequence_oldest import OldestConfig, OldestSequenceBatcher

    clock = FakeClock()
    engines = [GatedEngine(max_batch_size=4), GatedEngine(max_batch_size=4)]
    config = OldestConfig(max_batch_size=4, slots=1, max_queue_delay_s=0.0)
    batcher = OldestSequenceBatcher(engines, config, clock=clock)
    runner = asyncio.create_task(batcher.run())

    def item(value: float, cid: str, start: bool = False, end: bool = False) -> WorkItem:
        return WorkItem(
            item_input(value), arrival=clock.now(), sequence=SequenceTag(cid, start=start, end=end)
        )

    await batcher.submit(item(1, "a", start=True))
    await batcher.submit(item(11, "b", start=True))
    third = asyncio.create_task(batcher.submit(item(21, "c", start=True)))
    await settle()
    assert not third.done() and batcher.sequences.free == 0  # one candidate per instance, both taken
    await batcher.submit(item(12, "b", end=True))  # b ends: its instance's slot goes to c
    await third
    await batcher.submit(item(2, "a", end=True))
    await batcher.submit(item(22, "c", end=True))
    assert engines[0].seen == [1, 2] and engines[1].seen == [11, 12, 21, 22]
    await batcher.drain()
    await runner
    batcher.close()


def test_implicit_state_starts_from_a_data_file_and_carries_over(tmp_path):
    """The engine alone: each request gets its sequence's state (the data file's on START),
    and the state output is kept, not answered."""
    folder = onnx_accumulator(tmp_path)
    config = folder / "config.pbtxt"
    config.write_text(config.read_text().replace("zero_data: true", 'data_file: "hundred"'))
    (folder / "initial_state").mkdir()
    (folder / "initial_state" / "hundred").write_bytes(np.array([100], np.int32).tobytes())
    (plan,) = plan_model(folder, Settings(telemetry=False))
    engine = plan.engine_factory(plan.serving.engine)
    sequence = plan.serving.sequence
    state: dict = {}
    try:
        answers = []
        for k, value in enumerate((1, 2, 3)):
            tag = SequenceTag(5, start=k == 0, state=state)
            inputs = sequence.admit(tag, 1, {"INPUT": np.array([[value]], np.int32)})
            (answer,) = engine.run_requests([(inputs, SimpleNamespace(sequence=tag), lambda: False)])
            answers.append(int(answer["OUTPUT"][0, 0]))
            assert set(answer) == {"OUTPUT", "CORRID_OUT"}
        assert answers == [101, 103, 106]
    finally:
        engine.close()


@pytest.mark.parametrize("cls", [SequenceBatcher, "oldest"])
def test_no_queue_time_bound_for_a_request_that_waited_its_turn(cls):
    """wattserve's max_queue_wait_s would answer 503 a request that waited for the one before
    it in its sequence: it is not late (and Triton's sequence batcher has no such bound)."""
    from wattserve.batchers.sequence_oldest import OldestSequenceBatcher

    policy = OldestSequenceBatcher if cls == "oldest" else cls
    config = policy.config_from(BatchingSpec(max_queue_wait_s=3.0), GatedEngine())
    assert config.max_queue_wait_s == 0.0


def test_auto_complete_cannot_swap_a_sequence_model_to_dynamic_batching(tmp_path):
    """Triton's words when a Python model's auto_complete_config sets dynamic batching on a
    config with sequence_batching (one scheduler per model, never silently replaced)."""
    folder = python_accumulator(tmp_path)
    model = folder / "1" / "model.py"
    model.write_text(
        model.read_text().replace(
            "class TritonPythonModel:",
            """class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.set_dynamic_batching()
        return config
""",
        )
    )
    with pytest.raises(ConfigError) as refused:
        plan_model(folder, Settings(telemetry=False))
    assert (
        "Configuration specified scheduling_choice as 'sequence_batching', but auto-complete-config"
        in str(refused.value)
    )
    assert "tries to set scheduling_choice as 'dynamic_batching'" in str(refused.value)


def test_a_string_state_starts_empty_and_refuses_a_data_file(tmp_path):
    """TYPE_STRING implicit state (Triton's QA has ONNX and libtorch models with one): its
    zeros are empty strings; a data file for it is refused by name."""
    folder = onnx_accumulator(tmp_path)
    config = folder / "config.pbtxt"
    text = config.read_text().replace(
        "data_type: TYPE_INT32 dims: [ 1 ]\n", "data_type: TYPE_STRING dims: [ 1 ]\n"
    )
    text = text.replace("initial_state { data_type: TYPE_INT32", "initial_state { data_type: TYPE_STRING")
    config.write_text(text)
    spec = sequence_spec(parse_config(text), "acc_onnx", "config.pbtxt", folder)
    assert spec.states[0].initial().tolist() == [[b""]]
    with pytest.raises(ConfigError, match="data_file for a TYPE_STRING state is not supported"):
        sequence_spec(parse_config(text.replace("zero_data: true", 'data_file: "x"')), "m", "c", folder)


def test_an_auto_completed_sequence_model_takes_no_control_input_from_clients(tmp_path):
    """A config with no tensors and no max_batch_size: auto-complete reads them from
    model.onnx (max_batch_size 4, Triton's default) but adds no dynamic_batching, and the
    control and state tensors stay the server's (not client inputs or outputs)."""
    folder = onnx_accumulator(tmp_path)
    config = folder / "config.pbtxt"
    text = config.read_text()
    text = text[text.index("sequence_batching") :].replace("instance_group", "\ninstance_group")
    config.write_text('platform: "onnxruntime_onnx"\n' + text)
    (plan,) = plan_model(folder, Settings(telemetry=False))
    assert (
        plan.config.max_batch_size == 4 and plan.config.WhichOneof("scheduling_choice") == "sequence_batching"
    )
    engine = plan.engine_factory(plan.serving.engine)
    try:
        assert [s.name for s in engine.inputs] == ["INPUT"]
        assert sorted(s.name for s in engine.outputs) == ["CORRID_OUT", "OUTPUT"]
    finally:
        engine.close()


# ---------------------------------------------------------------- Triton's delay hook, slot rows


@pytest.mark.parametrize(
    ("hook", "queued", "backlogged", "holds"),
    [
        (DelayHook(), 0, 0, False),  # unset: never holds
        (DelayHook(0, 3), 0, 0, False),  # the backlog count alone holds nothing (Triton's)
        (DelayHook(4), 3, 9, True),
        (DelayHook(4), 4, 0, False),
        (DelayHook(4, 2), 4, 1, True),  # both counts must be reached
        (DelayHook(4, 2), 5, 2, False),
    ],
)
def test_the_delay_hook_holds_until_both_counts_are_reached(hook, queued, backlogged, holds):
    assert hook.holds(queued, backlogged) is holds


def test_the_delay_hook_is_read_from_the_environment_as_triton_reads_it():
    assert delay_hook({}) == DelayHook()
    assert delay_hook({DELAY_VARIABLE: "12", BACKLOG_VARIABLE: "2"}) == DelayHook(12, 2)
    assert delay_hook({DELAY_VARIABLE: " 8 requests", BACKLOG_VARIABLE: "x"}) == DelayHook(8, 0)  # atoi
    assert delay_hook({DELAY_VARIABLE: "-3"}) == DelayHook()


def test_a_sequence_model_takes_the_delay_hook_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(DELAY_VARIABLE, "10")
    monkeypatch.setenv(BACKLOG_VARIABLE, "3")
    (plan,) = plan_model(onnx_accumulator(tmp_path), Settings(telemetry=False))
    config = SequenceBatcher.config_from(plan.serving.batching, GatedEngine())
    assert config.delay == DelayHook(10, 3)


async def test_the_delay_hook_counts_requests_waiting_their_turn_then_lets_go_for_good():
    """Triton's TRITONSERVER_DELAY_SCHEDULER=5: no batch until five requests wait in the slots,
    those behind the one before them in their sequence included; then batches form as
    without the hook, also for requests that come later."""
    engine = GatedEngine(max_batch_size=4)
    batcher = SequenceBatcher([engine], SequenceConfig(max_batch_size=4, delay=DelayHook(5)))
    runner = asyncio.create_task(batcher.run())
    sent = [sequence_item(1, "a", start=True), sequence_item(2, "a", end=True), sequence_item(11, "b", start=True),
            sequence_item(12, "b"), sequence_item(21, "c", start=True, end=True)]  # fmt: skip
    tasks = [asyncio.create_task(batcher.submit(item)) for item in sent[:4]]
    await settle()
    assert engine.batches == [] and batcher.queue_depth == 2 and batcher.sequences.waiting_in_slots == 2
    tasks.append(asyncio.create_task(batcher.submit(sent[4])))
    await asyncio.gather(*tasks)
    assert engine.batches[0] == [1, 11, 21]  # all three slots' first requests, in one batch
    assert sorted(engine.seen) == [1, 2, 11, 12, 21]
    await batcher.submit(sequence_item(13, "b", end=True))  # the hold is over: at once
    await batcher.drain()
    await runner


async def test_the_backlog_delay_hook_waits_for_sequences_without_a_slot_too():
    """With TRITONSERVER_BACKLOG_DELAY_SCHEDULER the hold also waits until that many requests
    wait in the backlog (sequences that have no slot yet)."""
    engine = GatedEngine(max_batch_size=2)
    batcher = SequenceBatcher([engine], SequenceConfig(max_batch_size=2, delay=DelayHook(2, 2)))
    runner = asyncio.create_task(batcher.run())
    tasks = [asyncio.create_task(batcher.submit(sequence_item(v, cid, start=True, end=True)))
             for v, cid in ((1, "a"), (2, "b"), (3, "c"))]  # fmt: skip
    await settle()
    assert engine.batches == [] and batcher.sequences.waiting_for_slot == 1  # "c" has no slot
    tasks.append(asyncio.create_task(batcher.submit(sequence_item(4, "d", start=True, end=True))))
    await asyncio.gather(*tasks)
    assert engine.batches == [[1, 2], [3, 4]]
    await batcher.drain()
    await runner


async def test_a_drain_ends_the_delay_hooks_hold():
    engine = GatedEngine(max_batch_size=4)
    batcher = SequenceBatcher([engine], SequenceConfig(max_batch_size=4, delay=DelayHook(8)))
    runner = asyncio.create_task(batcher.run())
    task = asyncio.create_task(batcher.submit(sequence_item(1, "a", start=True, end=True)))
    await settle()
    assert engine.batches == []
    await batcher.drain()
    await task
    await runner
    assert engine.seen == [1]


async def test_oldest_holds_until_its_queue_holds_the_count():
    """The oldest strategy holds where Triton's does, in its dynamic batcher: the queue (each
    candidate sequence's oldest request) must hold the count."""
    from wattserve.batchers.sequence_oldest import OldestConfig, OldestSequenceBatcher

    engine = GatedEngine(max_batch_size=4)
    config = OldestConfig(max_batch_size=4, slots=4, max_queue_delay_s=0.0, delay=DelayHook(2))
    batcher = OldestSequenceBatcher([engine], config)
    runner = asyncio.create_task(batcher.run())
    tasks = [asyncio.create_task(batcher.submit(sequence_item(v, "a", start=v == 1, end=v == 3)))
             for v in (1, 2, 3)]  # fmt: skip
    await settle()
    assert engine.batches == []  # three requests, but one of them queued
    tasks.append(asyncio.create_task(batcher.submit(sequence_item(11, "b", start=True, end=True))))
    await asyncio.gather(*tasks)
    assert engine.batches[0] == [1, 11]
    await batcher.drain()
    await runner


def test_a_slot_goes_to_the_lowest_free_number_and_passes_to_the_backlog():
    loop = asyncio.new_event_loop()
    try:
        sequences = Sequences(2, 0.0)
        a, b = (sequences.join(SequenceTag(cid, start=True), loop) for cid in ("a", "b"))
        c = sequences.join(SequenceTag("c", start=True), loop)
        assert (a.index, b.index, c.index) == (0, 1, None)
        sequences.waits(b)
        sequences.waits(c)  # a request of c waits in the backlog: no slot, no row
        assert (sequences.highest_waiting(), sequences.waiting_in_slots, sequences.waiting_for_slot) == (
            1,
            1,
            1,
        )
        sequences.waited(b)
        sequences.release(a)
        assert c.index == 0  # the backlog's first sequence takes the slot, and its row
        assert (sequences.highest_waiting(), sequences.waiting_in_slots, sequences.waiting_for_slot) == (
            0,
            1,
            0,
        )
        sequences.waited(c)
        assert sequences.highest_waiting() == -1
        sequences.release(b)
        d = sequences.join(SequenceTag("d", start=True), loop)
        assert d.index == 1
    finally:
        loop.close()


async def test_each_instance_has_its_own_slots_and_a_sequence_runs_only_on_its_own():
    """Triton's sequence batcher over two instances of max_batch_size 2: each instance has
    slots 0 and 1; a starting sequence takes the lowest free slot number of either instance
    (a: instance 0 slot 0, b: instance 1 slot 0, c: instance 0 slot 1) and keeps it for its
    whole life: its requests run only on that instance, at that slot's row of the instance's
    batch, which is as wide as the instance's highest slot with a request pending (a lone
    request at slot 1 runs as row 1 of 2: a null row for the idle slot 0)."""
    clock = FakeClock()
    engines = [GatedEngine(max_batch_size=2), GatedEngine(max_batch_size=2)]
    config = SequenceConfig(max_batch_size=2, delay=DelayHook(3))
    batcher = SequenceBatcher(engines, config, clock=clock)
    runner = asyncio.create_task(batcher.run())

    def item(value: float, cid: str, start: bool = False, end: bool = False) -> WorkItem:
        return WorkItem(
            item_input(value), arrival=clock.now(), sequence=SequenceTag(cid, start=start, end=end)
        )

    def placed(request: WorkItem) -> tuple:
        tag = request.sequence
        assert tag is not None
        return tag.instance, tag.slot, tag.width

    first = [item(1, "a", start=True), item(11, "b", start=True), item(21, "c", start=True)]
    await asyncio.gather(*(batcher.submit(request) for request in first))
    # held until all three wait (the delay hook counts both instances' slots), then one
    # batch per instance: instance 0 has a and c at rows 0 and 1, instance 1 has b alone
    assert engines[0].batches == [[1, 21]] and engines[1].batches == [[11]]
    assert [placed(request) for request in first] == [(0, 0, 2), (1, 0, 1), (0, 1, 2)]
    c_end = item(22, "c", end=True)
    await batcher.submit(c_end)  # alone on instance 0, at slot 1: row 0 is a null row
    assert engines[0].batches[-1] == [22] and placed(c_end) == (0, 1, 2)
    await batcher.submit(item(12, "b", end=True))
    assert engines[1].batches[-1] == [12]
    # free now: instance 0 slot 1 (c's) and instance 1 slot 0 (b's); the lowest number goes
    d = item(31, "d", start=True)
    await batcher.submit(d)
    assert engines[1].batches[-1] == [31] and placed(d) == (1, 0, 1)
    a_next = item(2, "a")
    await batcher.submit(a_next)  # a stays on instance 0, slot 0, whatever is free elsewhere
    assert engines[0].batches[-1] == [2] and placed(a_next) == (0, 0, 1)
    assert sorted(engines[0].seen) == [1, 2, 21, 22] and sorted(engines[1].seen) == [11, 12, 31]
    for cid, value in (("a", 3), ("d", 32)):
        await batcher.submit(item(value, cid, end=True))
    assert batcher.sequences.free == 4 and not batcher.sequences.live
    assert clock.now() == 100.0  # no time passed: nothing here waits on a timer
    await batcher.drain()
    await runner
    batcher.close()


def test_two_instances_run_their_own_slots_rows_with_null_rows_and_keep_each_sequences_state(tmp_path):
    """The ONNX accumulator on two instances of max_batch_size 2, through the batcher:
    each instance's batch has its own slots' rows, a lone request at slot 1 runs behind a
    null row (READY 0, CORRID 0), and every running sum is its own sequence's."""
    folder = onnx_accumulator(tmp_path)
    config_file = folder / "config.pbtxt"
    config_file.write_text(config_file.read_text().replace("max_batch_size: 4", "max_batch_size: 2"))
    (plan,) = plan_model(folder, Settings(telemetry=False))
    sequence = plan.serving.sequence
    seen: list[list[dict]] = [[], []]
    engines = [plan.engine_factory(plan.serving.engine) for _ in range(2)]
    for engine, batches in zip(engines, seen, strict=True):  # each model call's inputs, per instance
        run = engine.inner.infer
        engine.inner.infer = lambda batch, run=run, batches=batches: batches.append(batch) or run(batch)
    clock = FakeClock()
    config = replace(SequenceBatcher.config_from(plan.serving.batching, engines[0]), delay=DelayHook(3))
    batcher = SequenceBatcher(engines, config, clock=clock)

    def item(cid: int, value: int, start: bool = False, end: bool = False) -> WorkItem:
        tag = SequenceTag(cid, start=start, end=end)
        inputs = sequence.admit(tag, 1, {"INPUT": np.array([[value]], np.int32)})
        return WorkItem(inputs, arrival=clock.now(), context=SimpleNamespace(sequence=tag), sequence=tag)

    async def scenario() -> list[int]:
        runner = asyncio.create_task(batcher.run())
        results = await asyncio.gather(
            *(batcher.submit(item(cid, 10 * cid, start=True)) for cid in (1, 2, 3))
        )
        results.append(await batcher.submit(item(3, 5, end=True)))  # slot 1 of instance 0, alone
        results.append(await batcher.submit(item(2, 7, end=True)))  # slot 0 of instance 1
        results.append(await batcher.submit(item(1, 1, end=True)))  # slot 0 of instance 0
        await batcher.drain()
        await runner
        return [int(result.outputs["OUTPUT"][0, 0]) for result in results]

    try:
        assert asyncio.run(scenario()) == [10, 20, 30, 35, 27, 11]
    finally:
        batcher.close()
    column = lambda batch, name: batch[name][:, 0].tolist()  # noqa: E731
    assert [column(b, "READY") for b in seen[0]] == [[1, 1], [0, 1], [1]]
    assert [column(b, "CORRID") for b in seen[0]] == [[1, 3], [0, 3], [1]]
    assert [column(b, "READY") for b in seen[1]] == [[1], [1]]
    assert [column(b, "CORRID") for b in seen[1]] == [[2], [2]]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_delay_hook_and_slot_rows_over_http_and_grpc(tmp_path, monkeypatch, protocol):
    """Triton's direct batcher, through the server: TRITONSERVER_DELAY_SCHEDULER=3 holds three
    sequences' first requests into one batch; later a lone request runs at its slot's row
    with null requests (READY 0) in the idle slots below it, which the statistics count in
    the batch's size but not as inferences, and which touch no sequence's state."""
    monkeypatch.setenv(DELAY_VARIABLE, "3")
    onnx_accumulator(tmp_path)
    port = free_port()
    settings = Settings(model_repository=tmp_path, telemetry=False, grpc_port=port)
    with threaded_server(settings) as (url, _):
        address = url.removeprefix("http://") if protocol == "http" else f"127.0.0.1:{port}"
        cids = (101, 102, 103)
        with ThreadPoolExecutor(3) as pool:
            first = [pool.submit(step, protocol, address, "acc_onnx", 10 * k, cid, True, False)
                     for k, cid in enumerate(cids[:2], 1)]  # fmt: skip
            time.sleep(0.3)
            assert not any(f.done() for f in first)  # held: two of three requests
            first.append(pool.submit(step, protocol, address, "acc_onnx", 30, cids[2], True, False))
            assert [int(f.result(timeout=30)["OUTPUT"]) for f in first] == [10, 20, 30]
        # the last sequence to start has slot 2: its lone request runs as row 2 of 3; the other
        # two have slots 0 and 1 (in whichever order they arrived): batches of 1 and 2 rows
        assert int(step(protocol, address, "acc_onnx", 5, cids[2], False, True)["OUTPUT"]) == 35
        assert int(step(protocol, address, "acc_onnx", 1, cids[0], False, True)["OUTPUT"]) == 11
        assert int(step(protocol, address, "acc_onnx", 2, cids[1], False, True)["OUTPUT"]) == 22
        stats = httpx.get(f"{url}/v2/models/acc_onnx/stats").json()["model_stats"][0]
    sizes = {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}
    assert sizes == {3: 2, 2: 1, 1: 1}  # Triton's counts: null rows in the batch size...
    assert stats["inference_count"] == 6 and stats["execution_count"] == 4  # ...not in inferences


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_state_output_the_config_lists_is_answered_and_one_it_does_not_is_refused(tmp_path, protocol):
    """Triton's L0_implicit_state: a client may ask for a state output only when the config
    also lists it among the outputs (then it gets the next state); else Triton's words."""
    for folder in (onnx_accumulator(tmp_path, "acc_out"), torchscript_accumulator(tmp_path, "ts_out")):
        config = folder / "config.pbtxt"
        config.write_text(
            config.read_text() + 'output [ { name: "SUM_OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        )
    onnx_accumulator(tmp_path)
    port = free_port()
    with threaded_server(Settings(model_repository=tmp_path, telemetry=False, grpc_port=port)) as (url, _):
        module = thttp if protocol == "http" else tgrpc
        client = module.InferenceServerClient(
            url.removeprefix("http://") if protocol == "http" else f"127.0.0.1:{port}"
        )
        wanted = [module.InferRequestedOutput("SUM_OUT"), module.InferRequestedOutput("OUTPUT")]
        for model in ("acc_out", "ts_out"):
            for k, value in enumerate((3, 4)):
                result = client.infer(model, [one_input(module, value)], outputs=wanted, sequence_id=7,
                                      sequence_start=k == 0, sequence_end=k == 1)  # fmt: skip
                assert (
                    int(result.as_numpy("SUM_OUT")[0, 0]) == int(result.as_numpy("OUTPUT")[0, 0]) == 3 + 4 * k
                )
        with pytest.raises(
            InferenceServerException, match="unexpected inference output 'SUM_OUT' for model 'acc_onnx'"
        ):
            client.infer(
                "acc_onnx", [one_input(module, 1)], outputs=wanted, sequence_id=8, sequence_start=True
            )


def test_requests_run_at_their_slots_rows_with_not_ready_null_requests_in_the_others(tmp_path):
    """The engine alone (Triton's direct batch): requests at slots 1 and 3 run as rows 1 and
    3 of four; rows 0 and 2 are null requests (the first request's input and state, READY,
    START 0, CORRID 0) whose outputs nobody gets and whose state nobody keeps; a batch's
    width (a slot the batcher left for another shape) adds rows past its own highest slot."""
    (plan,) = plan_model(onnx_accumulator(tmp_path), Settings(telemetry=False))
    engine = plan.engine_factory(plan.serving.engine)
    sequence = plan.serving.sequence
    seen: list[dict] = []
    inner = engine.inner
    engine.inner = SimpleNamespace(max_batch_size=inner.max_batch_size,
                                   infer=lambda batch: seen.append(batch) or inner.infer(batch))  # fmt: skip
    states: dict = {1: {}, 2: {}}

    def request(cid, value, slot, start=False, width=0):
        tag = SequenceTag(cid, start=start, state=states[cid], slot=slot, width=width)
        inputs = sequence.admit(tag, 1, {"INPUT": np.array([[value]], np.int32)})
        return inputs, SimpleNamespace(sequence=tag), lambda: False

    try:
        first = [request(1, 5, 1, start=True), request(2, 7, 3, start=True)]
        assert engine.rows_for(first) == 4
        assert [int(a["OUTPUT"][0, 0]) for a in engine.run_requests(first)] == [5, 7]
        batch = seen[-1]
        assert batch["READY"][:, 0].tolist() == [0, 1, 0, 1] and batch["START"][:, 0].tolist() == [0, 1, 0, 1]
        assert batch["CORRID"][:, 0].tolist() == [0, 1, 0, 2] and batch["INPUT"][:, 0].tolist() == [
            5,
            5,
            5,
            7,
        ]
        second = [request(1, 1, 1, width=4)]  # slot 3 has a request of another shape waiting
        assert engine.rows_for(second) == 4
        assert int(engine.run_requests(second)[0]["OUTPUT"][0, 0]) == 6
        assert int(engine.run_requests([request(2, 1, 3)])[0]["OUTPUT"][0, 0]) == 8  # its own state
    finally:
        inner.close()


async def test_a_direct_batch_takes_every_ready_request_of_the_heads_shape_wherever_it_is_queued():
    """Triton's direct batcher: the first slot's request sets the batch's shape and every
    other slot's ready request of that shape joins it; one of another shape waits (here the
    queue is a, b, c with b of another shape: the batches are [a, c] then [b])."""
    engine = GatedEngine(max_batch_size=4)
    batcher = SequenceBatcher([engine], SequenceConfig(max_batch_size=4, delay=DelayHook(3)))
    runner = asyncio.create_task(batcher.run())
    items = [sequence_item(v, cid, start=True, end=True) for v, cid in ((1, "a"), (2, "b"), (3, "c"))]
    for item, key in zip(items, ((2,), (1,), (2,)), strict=True):
        item.shape_key = key  # as a variable-dims model's requests of those shapes have
    await asyncio.gather(*(batcher.submit(item) for item in items))
    assert engine.batches == [[1, 3], [2]]
    # slots 0..2 were ready for the first batch; then only slot 1 (b's): two rows
    assert [item.sequence.width for item in items] == [3, 2, 3]
    await batcher.drain()
    await runner
