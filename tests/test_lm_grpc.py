"""A language model's tokens over gRPC: ``ModelStreamInfer`` answers one response per token
(decoupled, as Triton's vLLM and TensorRT-LLM backends do), read with tritonclient.grpc's
``start_stream`` / ``async_stream_infer(enable_empty_final_response=True)`` against a real
server on loopback serving the tiny random Llama folder."""

from __future__ import annotations

import queue
import threading
import time

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tgrpc
from prometheus_client.parser import text_string_to_metric_families
from wattserve.loadgen.server_process import free_port
from wattserve.server.settings import Settings

from tests.lm_support import PROMPTS, hf_greedy, tiny_lm_folder
from tests.servers import threaded_server

MODEL = "tiny-llama"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm-grpc")
    return tiny_lm_folder(root, "llama").rename(root / MODEL)


@pytest.fixture(scope="module")
def server(folder):
    port = free_port()
    settings = Settings(
        model=str(folder), batcher="continuous", device="cpu", max_batch_size=16, grpc_port=port,
        lm_kv_blocks=256, lm_block_size=8, lm_token_budget=48,
    )  # fmt: skip
    with threaded_server(settings) as (url, app):
        yield url, f"127.0.0.1:{port}", app


def inputs(
    prompt: str, max_tokens: int, ignore_eos: bool = False, stream: bool | None = None
) -> list[tgrpc.InferInput]:
    text = tgrpc.InferInput("text_input", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([[prompt.encode()]], dtype=object))
    tokens = tgrpc.InferInput("max_tokens", [1, 1], "INT32")
    tokens.set_data_from_numpy(np.array([[max_tokens]], np.int32))
    out = [text, tokens]
    if ignore_eos:
        eos = tgrpc.InferInput("ignore_eos", [1, 1], "BOOL")
        eos.set_data_from_numpy(np.array([[True]]))
        out.append(eos)
    if stream is not None:  # the input Triton's vLLM and TensorRT-LLM backends take
        flag = tgrpc.InferInput("stream", [1, 1], "BOOL")
        flag.set_data_from_numpy(np.array([[stream]]))
        out.append(flag)
    return out


class Stream:
    """One tritonclient stream; every response (or error) lands in ``responses``."""

    def __init__(self, address: str) -> None:
        self.client = tgrpc.InferenceServerClient(address)
        self.responses: queue.Queue = queue.Queue()
        self.client.start_stream(lambda result, error: self.responses.put((result, error)))

    def send(self, prompt: str, max_tokens: int, request_id: str, **kwargs) -> None:
        ignore_eos = kwargs.pop("ignore_eos", False)
        stream = kwargs.pop("stream", None)
        self.client.async_stream_infer(
            MODEL, inputs(prompt, max_tokens, ignore_eos, stream), request_id=request_id,
            enable_empty_final_response=True, **kwargs,
        )  # fmt: skip

    def until_final(self, n: int = 1, timeout: float = 120) -> list[dict]:
        """Every response until ``n`` final ones, each as a plain dict."""
        got: list[dict] = []
        finals = 0
        while finals < n:
            result, error = self.responses.get(timeout=timeout)
            assert error is None, error
            response = result.get_response()
            final = response.parameters["triton_final_response"].bool_param
            ids = result.as_numpy("output_ids")
            text = result.as_numpy("text_output")
            got.append({
                "id": response.id,
                "final": final,
                "ids": [] if ids is None else ids[0].tolist(),
                "text": "" if text is None else b"".join(text.ravel()).decode(),
            })  # fmt: skip
            finals += final
        return got

    def close(self, cancel: bool = False) -> None:
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


def metric(url: str, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10).text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return None


def test_stream_sends_one_response_per_token_equal_to_http_generate_and_hf(server, folder):
    url, address, _ = server
    want_ids, want_text = hf_greedy(folder, PROMPTS[1], 12)
    stream = Stream(address)
    try:
        stream.send(PROMPTS[1], 12, "r1")
        got = stream.until_final()
    finally:
        stream.close()
    assert len(got) == len(want_ids)  # one response per token, the last one final
    assert [r["final"] for r in got] == [False] * (len(want_ids) - 1) + [True]
    assert {r["id"] for r in got} == {"r1"}
    assert [r["ids"] for r in got] == [[t] for t in want_ids]
    http = httpx.post(
        f"{url}/v2/models/{MODEL}/generate", json={"text_input": PROMPTS[1], "max_tokens": 12}, timeout=60
    ).json()
    assert "".join(r["text"] for r in got) == http["text_output"] == want_text


def test_stream_false_parameter_or_input_answers_once_with_the_whole_text(server, folder):
    _, address, _ = server
    want_ids, want_text = hf_greedy(folder, PROMPTS[3], 9)
    stream = Stream(address)
    try:
        stream.send(PROMPTS[3], 9, "whole", parameters={"stream": False})
        by_parameter = stream.until_final()
        stream.send(PROMPTS[3], 9, "whole-input", stream=False)
        by_input = stream.until_final()
        stream.send(PROMPTS[3], 9, "tokens-input", stream=True)
        by_tokens = stream.until_final()
    finally:
        stream.close()
    for got, request_id in ((by_parameter, "whole"), (by_input, "whole-input")):
        assert len(got) == 1 and got[0]["final"] and got[0]["id"] == request_id
        assert (got[0]["ids"], got[0]["text"]) == (want_ids, want_text)
    assert [r["ids"] for r in by_tokens] == [[t] for t in want_ids]


def test_two_concurrent_streams_each_get_their_own_text(server, folder):
    _, address, _ = server
    prompts = {"a": (PROMPTS[0], 14), "b": (PROMPTS[4], 10)}
    results: dict[str, list[dict]] = {}
    errors: list[BaseException] = []

    def run(key: str) -> None:
        stream = Stream(address)
        try:
            prompt, n = prompts[key]
            stream.send(prompt, n, key)
            results[key] = stream.until_final()
        except BaseException as exc:
            errors.append(exc)
        finally:
            stream.close()

    threads = [threading.Thread(target=run, args=(k,)) for k in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert errors == []
    for key, (prompt, n) in prompts.items():
        want_ids, want_text = hf_greedy(folder, prompt, n)
        assert {r["id"] for r in results[key]} == {key}
        assert [t for r in results[key] for t in r["ids"]] == want_ids
        assert "".join(r["text"] for r in results[key]) == want_text


def test_nine_streamed_generations_on_one_stream_equal_hf_each(server, folder):
    """The same request alone and among eight others at different positions, one stream."""
    _, address, _ = server
    stream = Stream(address)
    try:
        for i, prompt in enumerate(PROMPTS[:9]):
            stream.send(prompt, 6 + i, f"r{i}")
        got = stream.until_final(9)
    finally:
        stream.close()
    for i, prompt in enumerate(PROMPTS[:9]):
        mine = [r for r in got if r["id"] == f"r{i}"]
        assert [t for r in mine for t in r["ids"]] == hf_greedy(folder, prompt, 6 + i)[0]
        assert [r["final"] for r in mine].count(True) == 1 and mine[-1]["final"]


def test_a_cancelled_stream_stops_its_generation_and_frees_its_blocks(server, folder):
    url, address, app = server
    labels = {"model": MODEL}
    before = metric(url, "wattserve_lm_output_tokens_total", **labels) or 0.0
    stream = Stream(address)
    stream.send(PROMPTS[0], 480, "long", ignore_eos=True)
    for _ in range(3):  # the generation is running: tokens are arriving
        result, error = stream.responses.get(timeout=60)
        assert error is None and result.get_response().id == "long"
    stream.close(cancel=True)
    # wait (bounded) for the leave to reach the engine: its blocks back, nothing running
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        used = metric(url, "wattserve_lm_kv_cache_blocks", state="used", **labels)
        if used == 0 and metric(url, "wattserve_running_states", **labels) == 0:
            break
        time.sleep(0.05)
    assert metric(url, "wattserve_lm_kv_cache_blocks", state="used", **labels) == 0
    assert metric(url, "wattserve_running_states", **labels) == 0
    generated = (metric(url, "wattserve_lm_output_tokens_total", **labels) or 0.0) - before
    assert 3 <= generated < 480  # stopped, not run to its end
    engine = app.state.models.runtimes()[0].engine
    assert engine.blocks.used == 0 and engine.blocks.free == engine.blocks.num_blocks
    # the server keeps serving, over gRPC and HTTP
    again = Stream(address)
    try:
        again.send(PROMPTS[2], 5, "after")
        got = again.until_final()
    finally:
        again.close()
    assert [t for r in got for t in r["ids"]] == hf_greedy(folder, PROMPTS[2], 5)[0]
    r = httpx.post(
        f"{url}/v2/models/{MODEL}/generate", json={"text_input": "hello", "max_tokens": 2}, timeout=60
    )
    assert r.status_code == 200 and len(r.json()["output_ids"]) == 2


def test_a_bad_request_on_the_stream_is_refused_alone(server, folder):
    _, address, _ = server
    stream = Stream(address)
    try:
        stream.send(PROMPTS[0], -1, "bad")  # a negative max_tokens: INVALID_ARGUMENT, nothing queued
        result, error = stream.responses.get(timeout=60)
        assert result is None and "max_tokens" in str(error)
        stream.send(PROMPTS[0], 4, "good")
        got = stream.until_final()
    finally:
        stream.close()
    assert [t for r in got for t in r["ids"]] == hf_greedy(folder, PROMPTS[0], 4)[0]
