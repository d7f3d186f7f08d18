"""A language model served over HTTP: `wattserve serve --model FOLDER`, a repository entry
with ``backend: "transformers"``, Triton's generate extension and the OpenAI routes through
the unmodified ``openai`` client, on a real server on loopback."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from transformers import AutoTokenizer
from wattserve.loadgen.server_process import ServerProcess, free_port, serve_command, server_env
from wattserve.server.settings import Settings

from tests.lm_support import PROMPTS, hf_greedy, tiny_lm_folder
from tests.servers import threaded_server

MODEL = "tiny-llama"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm")
    path = tiny_lm_folder(root, "llama", chat_template=True)
    return path.rename(root / MODEL)


@pytest.fixture(scope="module")
def server(folder):
    settings = Settings(
        model=str(folder), batcher="continuous", device="cpu", max_batch_size=16,
        lm_kv_blocks=256, lm_block_size=8, lm_token_budget=48,
    )  # fmt: skip
    with threaded_server(settings) as (url, app):
        yield url, app


def test_served_under_the_folder_name_with_generate_in_the_extensions(server):
    url, _ = server
    assert "generate" in httpx.get(f"{url}/v2").json()["extensions"]
    meta = httpx.get(f"{url}/v2/models/{MODEL}").json()
    assert meta["platform"] == "transformers"
    assert {i["name"] for i in meta["inputs"]} >= {"text_input", "max_tokens", "temperature", "seed"}
    assert httpx.get(f"{url}/v1/models").json()["data"][0]["id"] == MODEL


async def test_generate_greedy_equals_hf_alone_and_among_eight_concurrent_others(server, folder):
    url, _ = server
    target = PROMPTS[1]
    want_ids, _ = hf_greedy(folder, target, 20)
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        alone = (
            await client.post(f"/v2/models/{MODEL}/generate", json={"text_input": target, "max_tokens": 20})
        ).json()
        assert alone["output_ids"] == want_ids

        async def one(prompt: str, n: int, delay: float) -> dict:
            await asyncio.sleep(delay)  # arrivals spread over the others' decoding
            r = await client.post(
                f"/v2/models/{MODEL}/generate", json={"text_input": prompt, "parameters": {"max_tokens": n}}
            )
            assert r.status_code == 200, r.text
            return r.json()

        others = [one(p, 10 + 4 * i, 0.01 * i) for i, p in enumerate(PROMPTS[2:] + PROMPTS[:1])]
        answers = await asyncio.gather(*others, one(target, 20, 0.05))
    assert answers[-1]["output_ids"] == want_ids
    for i, (p, a) in enumerate(zip(PROMPTS[2:] + PROMPTS[:1], answers[:-1], strict=True)):
        assert a["output_ids"] == hf_greedy(folder, p, 10 + 4 * i)[0]


def test_generate_stream_sends_the_text_token_by_token(server, folder):
    url, _ = server
    want_ids, _ = hf_greedy(folder, PROMPTS[0], 8)
    events = []
    with httpx.stream(
        "POST",
        f"{url}/v2/models/{MODEL}/generate_stream",
        json={"text_input": PROMPTS[0], "max_tokens": 8},
        timeout=60,
    ) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    assert [e["output_ids"] for e in events] == want_ids
    assert events[-1]["finish_reason"] == "length"
    assert (
        "".join(e["text_output"] for e in events)
        == httpx.post(
            f"{url}/v2/models/{MODEL}/generate", json={"text_input": PROMPTS[0], "max_tokens": 8}, timeout=60
        ).json()["text_output"]
    )


def test_seeded_sampling_over_http_is_the_same_alone_and_batched(server):
    url, _ = server
    body = {"text_input": PROMPTS[0], "max_tokens": 12, "temperature": 0.8, "top_k": 40, "seed": 7}
    alone = httpx.post(f"{url}/v2/models/{MODEL}/generate", json=body, timeout=60).json()["output_ids"]

    async def crowd() -> list[dict]:
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            noise = [
                client.post(
                    f"/v2/models/{MODEL}/generate",
                    json={"text_input": p, "max_tokens": 16, "temperature": 1.0},
                )
                for p in PROMPTS[1:8]
            ]
            rs = await asyncio.gather(*noise, client.post(f"/v2/models/{MODEL}/generate", json=body))
        return [r.json() for r in rs]

    assert asyncio.run(crowd())[-1]["output_ids"] == alone


def test_openai_client_completions_and_chat_stream_and_not(server, folder):
    url, _ = server
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
    want_ids, want_text = hf_greedy(folder, PROMPTS[3], 10)
    done = client.completions.create(model=MODEL, prompt=PROMPTS[3], max_tokens=10, temperature=0)
    assert done.choices[0].text == want_text
    tok = AutoTokenizer.from_pretrained(folder)
    prompt_tokens = len(tok(PROMPTS[3]).input_ids)
    assert (done.usage.prompt_tokens, done.usage.completion_tokens) == (prompt_tokens, len(want_ids))
    assert done.usage.total_tokens == prompt_tokens + len(want_ids)

    chunks = list(
        client.completions.create(
            model=MODEL, prompt=PROMPTS[3], max_tokens=10, temperature=0, stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    assert "".join(c.choices[0].text for c in chunks if c.choices) == want_text
    assert len([c for c in chunks if c.choices]) == len(want_ids)  # one chunk per token
    assert chunks[-1].usage.completion_tokens == len(want_ids)

    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello tokens"}]
    chat_prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert chat_prompt.startswith("<|system|>be brief")  # the folder's own template
    _, chat_text = hf_greedy(folder, chat_prompt, 6)
    chat = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=6, temperature=0)
    assert chat.choices[0].message.role == "assistant"
    assert chat.choices[0].message.content == chat_text
    assert chat.usage.prompt_tokens == len(tok(chat_prompt).input_ids)

    streamed = list(
        client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=6, temperature=0, stream=True
        )
    )
    assert streamed[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == chat_text
    assert streamed[-1].choices[0].finish_reason == "length"


def test_openai_bad_requests_are_4xx_and_the_server_keeps_serving(server):
    url, _ = server
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="x")
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model=MODEL, prompt="x", max_tokens=-1)
    with pytest.raises(openai.BadRequestError, match="n = 1"):
        client.completions.create(model=MODEL, prompt="x", n=2)
    with pytest.raises(openai.BadRequestError, match="messages"):
        client.chat.completions.create(model=MODEL, messages=[])
    r = httpx.post(f"{url}/v1/completions", content=b"{not json", timeout=10)
    assert r.status_code == 400 and "error" in r.json()
    ok = client.completions.create(model=MODEL, prompt="hello", max_tokens=2, temperature=0)
    assert ok.usage.completion_tokens == 2


def test_repository_entry_with_backend_transformers(tmp_path, folder):
    import shutil

    model_dir = tmp_path / "repo" / "chat"
    shutil.copytree(folder, model_dir / "1")
    (model_dir / "config.pbtxt").write_text(
        'backend: "transformers"\nmax_batch_size: 4\n'
        'parameters { key: "batcher" value { string_value: "continuous" } }\n'
        'parameters { key: "lm_kv_blocks" value { string_value: "40" } }\n'
        'parameters { key: "lm_block_size" value { string_value: "4" } }\n'
        'parameters { key: "lm_token_budget" value { string_value: "16" } }\n'
    )
    settings = Settings(model_repository=tmp_path / "repo", device="cpu")
    with threaded_server(settings) as (url, app):
        engine = app.state.models.runtimes()[0].engine
        assert (engine.blocks.num_blocks, engine.blocks.block_size, engine.token_budget) == (40, 4, 16)
        r = httpx.post(
            f"{url}/v2/models/chat/generate", json={"text_input": PROMPTS[0], "max_tokens": 5}, timeout=60
        )
        assert r.status_code == 200, r.text
        assert r.json()["output_ids"] == hf_greedy(folder, PROMPTS[0], 5)[0]


def test_wattserve_serve_model_folder_from_the_command_line(folder):
    port = free_port()
    command = [*serve_command(), "--model", str(folder), "--model-name", "chatty", "--batcher", "continuous",
               "--device", "cpu", "--port", str(port)]  # fmt: skip
    with ServerProcess(command, server_env(), port, ready_timeout_s=180) as proc:
        base = f"http://127.0.0.1:{proc.port}"
        assert httpx.get(f"{base}/v2/models/chatty/ready").status_code == 200
        r = httpx.post(
            f"{base}/v2/models/chatty/generate", json={"text_input": "hello", "max_tokens": 3}, timeout=60
        )
        assert r.status_code == 200 and len(r.json()["output_ids"]) == 3


def test_metrics_count_tokens_blocks_preemptions_and_energy_per_token(folder):
    """A pool too small for six concurrent generations, on the simulated GPU (no NVML here:
    the simulated device is the labelled stand-in, source="simulated")."""
    settings = Settings(
        model=str(folder), batcher="continuous", device="cpu", lm_kv_blocks=12, lm_block_size=4,
        simulated_gpu="default", telemetry_interval_ms=50,
    )  # fmt: skip

    def value(text: str, name: str, **labels: str) -> float | None:
        want = {"model": MODEL, "batcher": "iteration", **labels}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in want.items()):
                    return sample.value
        return None

    with threaded_server(settings) as (url, _):
        assert value(httpx.get(f"{url}/metrics").text, "wattserve_lm_kv_cache_blocks", state="free") == 12

        async def crowd() -> list[int]:
            async with httpx.AsyncClient(base_url=url, timeout=120) as client:
                body = {"text_input": PROMPTS[1], "max_tokens": 20, "ignore_eos": True}
                rs = await asyncio.gather(
                    *(client.post(f"/v2/models/{MODEL}/generate", json=body) for _ in range(6))
                )
            return [r.status_code for r in rs]

        assert asyncio.run(crowd()) == [200] * 6
        deadline = time.monotonic() + 20
        previous = None
        while True:  # energy lands one simulated counter step after its iteration: wait till it settles
            text = httpx.get(f"{url}/metrics").text
            energy = value(text, "wattserve_lm_energy_per_output_token_joules", source="simulated")
            joules = value(text, "wattserve_energy_batch_joules_sum", source="simulated")
            if (energy is not None and joules == previous) or time.monotonic() > deadline:
                break
            previous = joules
            time.sleep(0.3)
    assert value(text, "wattserve_lm_output_tokens_total") == 120
    assert value(text, "wattserve_lm_time_to_first_token_seconds_count") == 6
    assert value(text, "wattserve_lm_time_per_output_token_seconds_count") == 6
    assert value(text, "wattserve_lm_preemptions_total") > 0
    assert value(text, "wattserve_lm_kv_cache_blocks", state="used") == 0
    assert energy is not None and joules is not None and energy == pytest.approx(joules / 120)


def test_grpc_stream_infer_answers_each_generation_with_hf_greedy_tokens(folder):
    """gRPC ModelStreamInfer with ``stream: false``: one answer per request, nine concurrent
    generations, each equal to generate() alone (token by token: tests/test_lm_grpc.py)."""
    import threading

    import numpy as np
    import tritonclient.grpc as tgrpc

    port = free_port()
    settings = Settings(model=str(folder), batcher="continuous", device="cpu", grpc_port=port)
    prompts = PROMPTS[:9]
    with threaded_server(settings):
        client = tgrpc.InferenceServerClient(f"127.0.0.1:{port}")
        answers: dict[str, list[int]] = {}
        errors: list[str] = []
        done = threading.Event()

        def callback(result, error):
            if error is not None:
                errors.append(str(error))
            else:
                answers[result.get_response().id] = result.as_numpy("output_ids")[0].tolist()
            if len(answers) + len(errors) == len(prompts):
                done.set()

        client.start_stream(callback)
        try:
            for i, prompt in enumerate(prompts):
                text = tgrpc.InferInput("text_input", [1, 1], "BYTES")
                text.set_data_from_numpy(np.array([[prompt.encode()]], dtype=object))
                tokens = tgrpc.InferInput("max_tokens", [1, 1], "INT32")
                tokens.set_data_from_numpy(np.array([[6 + i]], np.int32))
                client.async_stream_infer(
                    MODEL, [text, tokens], request_id=f"r{i}", parameters={"stream": False}
                )
            assert done.wait(120)
        finally:
            client.stop_stream()
            client.close()
    assert errors == []
    for i, prompt in enumerate(prompts):
        assert answers[f"r{i}"] == hf_greedy(folder, prompt, 6 + i)[0]
