"""Python models in their own processes (``python_model_isolation`` process, Triton's stub).

What Triton's python backend does and these tests hold wattserve to: a stub process that
dies fails the requests it was running, each with one INTERNAL error ("Stub process ... is
not healthy"), and is restarted for the next request (python_backend's python_be.cc:
``RespondErrorToAllRequests``, then a new stub); the server and its other models go on. An
execute that hangs is ended by ``python_execute_timeout_s`` (wattserve's own bound: Triton
waits on a live stub), the same way. A decoupled request's stream that the dying process
left open ends with one error response.

The engine is driven directly (as the batcher's executor does) where the answer of each
request must be seen; a real server on loopback, reached with Triton's client, shows the
other models answering throughout.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException
from wattserve.batchers.status import Status
from wattserve.engines.python_backend import shm
from wattserve.engines.python_backend.engine import ModelFailed
from wattserve.server.models.repository.plan import plan_model
from wattserve.server.settings import Settings

from support.python_models import write_python_model
from tests.servers import threaded_server

BASE = {"telemetry": False, "warmup": False, "torch_threads": 1}
WAIT_S = 60.0  # the most a test waits for an event or a state (a deadline, not a measured bound)
TIMEOUT = 'parameters {{ key: "python_execute_timeout_s" value: {{ string_value: "{}" }} }}'

ARGS_CONFIG = """
name: "args"
backend: "python"
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "ARGS" data_type: TYPE_STRING dims: [ 1 ] } ]
"""
ARGS_MODEL = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.args = args

    def execute(self, requests):
        text = json.dumps(self.args, sort_keys=True).encode()
        return [pb_utils.InferenceResponse([pb_utils.Tensor("ARGS", np.array([text], dtype=object))])
                for _ in requests]
"""


class Context:
    """What a front end hands the engine with a request (its id; a stream's sink)."""

    def __init__(self, rid: str = "", sink=None) -> None:
        self.id, self.outputs, self.parameters = rid, None, None
        self.response_sink = sink


def _never() -> bool:
    return False


def engine_for(repo: Path, kind: str, parameters: str = "", **settings):
    folder = write_python_model(repo, kind, parameters=parameters)
    (plan,) = plan_model(folder, Settings(telemetry=False, **settings))
    return plan.engine_factory(plan.serving.engine)


def run(engine, *values: float) -> list:
    return engine.run_requests([({"INPUT0": np.array([[v]], np.float32)}, Context(f"r{i}"), _never)
                                for i, v in enumerate(values)])  # fmt: skip


def wait_for(check, what: str) -> None:
    end = time.monotonic() + WAIT_S
    while not check():
        if time.monotonic() > end:
            raise AssertionError(f"not within {WAIT_S} s: {what}")
        time.sleep(0.01)


def test_tensors_cross_in_one_segment_that_the_reader_unlinks():
    import ml_dtypes

    namer = shm.Namer(shm.new_prefix("roundtrip"), "t")
    tensors = {
        "bf16": np.arange(6, dtype=ml_dtypes.bfloat16).reshape(2, 3),
        "bytes": np.array([[b"x", b"", b"yz"]], dtype=object),
        "empty": np.zeros((0, 3), np.float32),
        "strided": np.arange(10, dtype=np.int64)[::2],
        "scalar": np.array(True),
    }
    large = {"big": np.arange(1 << 19, dtype=np.float32), "tag": np.array([b"big"], dtype=object)}
    layout = shm.write(namer(), tensors)
    assert layout.segment is not None and (shm.SHM_DIR / layout.segment).exists()
    back = shm.read(layout)
    assert not (shm.SHM_DIR / layout.segment).exists()  # the reader's mapping outlives the name
    for name, value in tensors.items():
        assert back[name].dtype == value.dtype and back[name].shape == value.shape, name
        np.testing.assert_array_equal(back[name], value)
    back["strided"][0] = 7  # writable, as a thread-mode model's inputs are
    mapped = shm.read(shm.write(namer(), large))  # over COPY_BELOW: views of one mapping
    np.testing.assert_array_equal(mapped["big"], large["big"])
    assert mapped["tag"].tolist() == [b"big"] and mapped["big"].flags.writeable
    assert shm.write(namer(), {"nothing": np.zeros((0,), np.int32)}).segment is None


def test_a_models_parameters_choose_its_isolation(tmp_path):
    """The process setting says process (the default); a config's parameters win for it."""
    from wattserve.engines.python_backend.engine import PythonModelEngine
    from wattserve.engines.python_backend.process_engine import ProcessModelEngine

    pinned = 'parameters { key: "python_model_isolation" value: { string_value: "thread" } }'
    for parameters, kind in (("", ProcessModelEngine), (pinned, PythonModelEngine)):
        engine = engine_for(tmp_path / kind.__name__, "unstable", parameters)
        try:
            assert type(engine) is kind
            (answer,) = run(engine, 2.0)
            assert answer["OUTPUT0"].tolist() == [[4.0]]
        finally:
            engine.close()


def test_the_model_gets_the_same_initialize_args_in_both_modes(tmp_path):
    folder = tmp_path / "args"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(ARGS_CONFIG)
    (folder / "1" / "model.py").write_text(ARGS_MODEL)
    seen = {}
    for mode in ("process", "thread"):
        (plan,) = plan_model(folder, Settings(telemetry=False, python_model_isolation=mode))
        engine = plan.engine_factory(plan.serving.engine)
        try:
            (answer,) = engine.run_requests([({"X": np.array([[1]], np.int32)}, Context(), _never)])
            seen[mode] = json.loads(answer["ARGS"][0, 0])
        finally:
            engine.close()
    assert seen["process"] == seen["thread"]
    assert seen["process"]["model_name"] == "args" and seen["process"]["model_instance_name"] == "args_0_0"


@pytest.mark.parametrize("crash", [-1.0, -2.0], ids=["os._exit", "SIGSEGV"])
def test_a_crash_fails_each_request_of_its_batch_once_and_the_model_restarts(tmp_path, crash):
    engine = engine_for(tmp_path, "unstable")
    try:
        (first,) = run(engine, 1.0)
        assert first["OUTPUT0"].tolist() == [[2.0]]
        answers = run(engine, 2.0, crash, 3.0)
        assert len(answers) == 3
        for answer in answers:
            assert isinstance(answer, ModelFailed) and answer.status is Status.INTERNAL
            assert "Stub process 'unstable_0_0' is not healthy" in str(answer)
        (after,) = run(engine, 4.0)
        assert after["OUTPUT0"].tolist() == [[8.0]]
        assert int(after["PID"][0, 0]) != int(first["PID"][0, 0]) and engine.restarts == 1
    finally:
        engine.close()
    assert not list(shm.SHM_DIR.glob("wsv-pb-*-unstable_0_0-*")), "a segment outlived its worker"


async def test_every_request_gets_one_answer_while_workers_crash_under_load(tmp_path):
    """Two instances behind the dynamic batcher; every fifth request crashes its worker.
    Each request is answered once: its own doubled input, or its batch's error."""
    import asyncio

    from wattserve.batchers.dynamic import DynamicBatcher
    from wattserve.batchers.types import WorkItem

    folder = write_python_model(tmp_path, "unstable", parameters="")
    (plan,) = plan_model(folder, Settings(telemetry=False))
    engines = [plan.engine_factory(plan.serving.engine) for _ in range(2)]
    batcher = DynamicBatcher(engines, DynamicBatcher.config_from(plan.serving.batching, engines[0]))
    task = asyncio.create_task(batcher.run())
    try:
        values = [-1.0 if i % 5 == 4 else float(i) for i in range(40)]
        items = []
        for i, value in enumerate(values):
            item = WorkItem(inputs={"INPUT0": np.array([[value]], np.float32)}, rows=1)
            item.context = Context(f"r{i}")
            items.append(item)
        answers = await asyncio.gather(*(batcher.submit(item) for item in items), return_exceptions=True)
        assert len(answers) == len(values)
        for value, answer in zip(values, answers, strict=True):
            if isinstance(answer, BaseException):
                assert "is not healthy" in str(answer), answer
            else:
                assert answer.outputs["OUTPUT0"].tolist() == [[value * 2]]  # its own input
        assert all(isinstance(a, BaseException) for v, a in zip(values, answers, strict=True) if v < 0)
        last = WorkItem(inputs={"INPUT0": np.array([[1.5]], np.float32)}, rows=1)
        last.context = Context("last")
        assert (await batcher.submit(last)).outputs["OUTPUT0"].tolist() == [[3.0]]
    finally:
        await batcher.drain()
        await task
        batcher.close()  # closes its engines: each worker is finalized


def test_a_hang_past_the_execute_timeout_fails_its_batch_and_the_model_restarts(tmp_path):
    engine = engine_for(tmp_path, "unstable", TIMEOUT.format(1))
    try:
        (first,) = run(engine, 1.0)
        hung = run(engine, -3.0, 5.0)
        for answer in hung:
            assert isinstance(answer, ModelFailed) and answer.status is Status.INTERNAL
            assert "python_execute_timeout_s" in str(answer)
        (after,) = run(engine, 6.0)
        assert after["OUTPUT0"].tolist() == [[12.0]]
        assert int(after["PID"][0, 0]) != int(first["PID"][0, 0])
    finally:
        engine.close()


def test_a_stream_left_open_by_a_dying_worker_ends_with_one_error(tmp_path):
    engine = engine_for(tmp_path, "dies_streaming")
    streams: dict[str, list] = {"a": [], "b": [], "c": []}
    first = {name: threading.Event() for name in streams}
    ended = {name: threading.Event() for name in streams}

    def sink_for(name: str):
        def sink(outputs, error, final):
            streams[name].append((outputs, error, final))
            first[name].set()
            if final:
                ended[name].set()

        return sink

    def request(name: str, value: int):
        return ({"IN": np.array([[value]], np.int32)}, Context(name, sink_for(name)), _never)

    try:
        assert engine.run_requests([request("a", 7)]) == [{}]  # answered through its stream
        assert first["a"].wait(WAIT_S)
        (b,) = engine.run_requests([request("b", -1)])  # releases a's thread, which ends the process
        assert ended["a"].wait(WAIT_S)
        (outputs, error, final), (none, death, last) = streams["a"]
        assert outputs["OUT"].tolist() == [[7]] and error is None and not final
        assert none is None and isinstance(death, ModelFailed) and last and "not healthy" in str(death)
        # b: one error, either as its batch's answer (the process died during its execute)
        # or at the end of its stream (it died after)
        if isinstance(b, ModelFailed):
            assert streams["b"] == []
        else:
            assert b == {} and ended["b"].wait(WAIT_S) and len(streams["b"]) == 1
            assert isinstance(streams["b"][0][1], ModelFailed)
        assert engine.run_requests([request("c", 9)]) == [{}]  # a new worker serves
        assert first["c"].wait(WAIT_S)  # the restarted worker's response
        assert streams["c"][0][0]["OUT"].tolist() == [[9]]
    finally:
        engine.close()


# Once started, refuses to start again while the file "refuse" is in its folder; crashes on
# a negative input. For the restart that fails, and the one after that succeeds.
PICKY_CONFIG = """
name: "picky"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""
PICKY = """
import os
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        if os.path.exists(os.path.join(args["model_repository"], "refuse")):
            raise pb_utils.TritonModelException("refusing to start: the file 'refuse' is there")
        if "{exit_in_initialize}" == "yes":
            os._exit(5)

    def execute(self, requests):
        xs = [pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() for r in requests]
        if any((x < 0).any() for x in xs):
            os._exit(3)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x * 2)]) for x in xs]
"""


def picky(tmp_path: Path, exit_in_initialize: str = "no") -> Path:
    folder = tmp_path / "picky"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(PICKY_CONFIG)
    (folder / "1" / "model.py").write_text(PICKY.replace("{exit_in_initialize}", exit_in_initialize))
    return folder


def test_a_model_whose_import_crashes_fails_its_load_not_the_server(tmp_path):
    """auto_complete_config (and so the model's import) runs in a short-lived process, as
    Triton's stub does: an import that ends the process is a load error."""
    from wattserve.server.models.repository.config import ConfigError

    folder = picky(tmp_path)
    source = folder / "1" / "model.py"
    source.write_text("import os\nos._exit(7)\n" + source.read_text())
    with pytest.raises(ConfigError, match=r"model\.py: the process importing the model exited with code 7"):
        plan_model(folder, Settings(telemetry=False))


def test_a_worker_that_dies_in_initialize_fails_the_load_naming_it(tmp_path):
    (plan,) = plan_model(picky(tmp_path, "yes"), Settings(telemetry=False))
    with pytest.raises(Exception, match="Stub process 'picky_0_0' is not healthy \\(exited with code 5\\)"):
        plan.engine_factory(plan.serving.engine)


def test_a_worker_that_cannot_restart_fails_each_batch_until_it_can(tmp_path):
    folder = picky(tmp_path)
    (plan,) = plan_model(folder, Settings(telemetry=False))
    engine = plan.engine_factory(plan.serving.engine)
    try:
        (folder / "refuse").touch()  # from now on initialize raises
        (crashed,) = run(engine, -1.0)
        assert isinstance(crashed, ModelFailed) and "not healthy" in str(crashed)
        for _ in range(2):  # each batch tries again, and says why it cannot run
            (refused,) = run(engine, 1.0)
            assert isinstance(refused, ModelFailed) and refused.status is Status.INTERNAL
            assert "could not be restarted" in str(refused) and "the file 'refuse' is there" in str(refused)
        (folder / "refuse").unlink()
        (served,) = run(engine, 1.0)
        assert served["OUTPUT0"].tolist() == [[2.0]]
    finally:
        engine.close()


ENDS_THEN_DIES_CONFIG = """
name: "ends_then_dies"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
ENDS_THEN_DIES = """
import os
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            if value[0] >= 0:  # answered in full before the process ends
                request.get_response_sender().send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value)]),
                                                   flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        os._exit(6)
"""


def test_a_stream_that_ended_before_its_worker_died_is_not_answered_again(tmp_path):
    folder = tmp_path / "ends_then_dies"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(ENDS_THEN_DIES_CONFIG)
    (folder / "1" / "model.py").write_text(ENDS_THEN_DIES)
    (plan,) = plan_model(folder, Settings(telemetry=False))
    engine = plan.engine_factory(plan.serving.engine)
    events: dict[str, list] = {"done": [], "open": []}

    def request(name: str, value: int):
        def sink(outputs, error, final):
            events[name].append((outputs, error, final))

        return ({"IN": np.array([[value]], np.int32)}, Context(name, sink), _never)

    try:
        done, still_open = engine.run_requests([request("done", 3), request("open", -1)])
        assert done == {}  # its final response went out: the batch's error is not its answer
        assert isinstance(still_open, ModelFailed) and "not healthy" in str(still_open)
        assert [(o["OUT"].tolist(), e, f) for o, e, f in events["done"]] == [([[3]], None, True)]
        assert events["open"] == []
    finally:
        engine.close()


ASYNC_BLS_CONFIG = """
name: "async_bls"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""
ASYNC_BLS = """
import asyncio
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        calls = [pb_utils.InferenceRequest(model_name="unstable", requested_output_names=["OUTPUT0"],
                                           inputs=[pb_utils.get_input_tensor_by_name(r, "INPUT0")]).async_exec()
                 for r in requests]
        answers = await asyncio.gather(*calls)
        return [pb_utils.InferenceResponse(a.output_tensors(), error=a.error()) for a in answers]
"""


def test_an_async_model_awaits_bls_calls_from_its_worker(tmp_path):
    """``async def execute`` with ``async_exec``: the worker's own loop awaits answers the
    server sends back over the events lane; a callee's error comes back inside the response."""
    repo = tmp_path / "repo"
    write_python_model(repo, "unstable", parameters="")
    (repo / "async_bls" / "1").mkdir(parents=True)
    (repo / "async_bls" / "config.pbtxt").write_text(ASYNC_BLS_CONFIG)
    (repo / "async_bls" / "1" / "model.py").write_text(ASYNC_BLS)
    with threaded_server(Settings(model_repository=repo, grpc_port=0, **BASE)) as (url, _):
        client = thttp.InferenceServerClient(url.removeprefix("http://"))
        tensor = thttp.InferInput("INPUT0", [1, 1], "FP32")
        tensor.set_data_from_numpy(np.array([[2.5]], np.float32))
        assert client.infer("async_bls", [tensor]).as_numpy("OUTPUT0").tolist() == [[5.0]]
        tensor.set_data_from_numpy(np.array([[-1.0]], np.float32))  # the callee's worker dies
        with pytest.raises(InferenceServerException, match="is not healthy"):
            client.infer("async_bls", [tensor])
        tensor.set_data_from_numpy(np.array([[4.0]], np.float32))
        assert client.infer("async_bls", [tensor]).as_numpy("OUTPUT0").tolist() == [[8.0]]


IDENTITY = """backend: "wattserve"
max_batch_size: 16
dynamic_batching { max_queue_delay_microseconds: 0 }
parameters { key: "builtin" value: { string_value: "identity" } }
"""


def test_the_server_and_its_other_models_go_on_through_a_crash_and_a_hang(tmp_path):
    repo = tmp_path / "repo"
    unstable = write_python_model(repo, "unstable", parameters=TIMEOUT.format(3))
    write_python_model(repo, "add_sub")
    (repo / "identity").mkdir()
    (repo / "identity" / "config.pbtxt").write_text(IDENTITY)
    with threaded_server(Settings(model_repository=repo, grpc_port=0, **BASE)) as (url, _):
        host = url.removeprefix("http://")
        client = thttp.InferenceServerClient(host)  # this thread's (tritonclient's are per thread)

        def unstable_infer(value: float):
            client = thttp.InferenceServerClient(host)
            tensor = thttp.InferInput("INPUT0", [1, 1], "FP32")
            tensor.set_data_from_numpy(np.array([[value]], np.float32))
            return client.infer("unstable", [tensor])

        def others_answer() -> None:
            a = thttp.InferInput("INPUT0", [4], "FP32")
            a.set_data_from_numpy(np.arange(4, dtype=np.float32))
            b = thttp.InferInput("INPUT1", [4], "FP32")
            b.set_data_from_numpy(np.ones(4, np.float32))
            assert client.infer("add_sub", [a, b]).as_numpy("OUTPUT0").tolist() == [1.0, 2.0, 3.0, 4.0]
            x = thttp.InferInput("INPUT0", [1, 16], "FP32")
            x.set_data_from_numpy(np.full((1, 16), 3, np.float32))
            assert client.infer("identity", [x]).as_numpy("OUTPUT0").tolist() == [[3.0] * 16]

        assert unstable_infer(1.0).as_numpy("OUTPUT0").tolist() == [[2.0]]
        with ThreadPoolExecutor(3) as pool:  # a crash: each of its requests gets one error
            crashed = [pool.submit(unstable_infer, -1.0) for _ in range(3)]
            for future in crashed:
                with pytest.raises(InferenceServerException, match="is not healthy") as raised:
                    future.result()
                assert raised.value.status() == "500"
        others_answer()
        assert unstable_infer(2.0).as_numpy("OUTPUT0").tolist() == [[4.0]]

        with ThreadPoolExecutor(1) as pool:  # a hang: others answer while it hangs
            hung = pool.submit(unstable_infer, -3.0)
            wait_for((unstable / "hanging").exists, "the model to hang")
            for _ in range(5):
                others_answer()
            with pytest.raises(InferenceServerException, match="python_execute_timeout_s") as raised:
                hung.result()
            assert raised.value.status() == "500"
        assert unstable_infer(3.0).as_numpy("OUTPUT0").tolist() == [[6.0]]
        others_answer()
        assert client.is_server_live() and client.is_model_ready("unstable")
