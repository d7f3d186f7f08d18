"""`wattserve loadgen --api ...` against a real server on loopback serving a tiny random-weight
language model: every request answered, TTFT <= latency for each, the tokens it counts equal
the server's; and the stream reader on the events each route sends."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from wattserve.loadgen import cli
from wattserve.loadgen.lm_client import _Reader
from wattserve.server.settings import Settings

from tests.lm_support import tiny_lm_folder
from tests.servers import ROOT, threaded_server

MODEL = "tiny-gpt2"
APIS = ["generate", "openai-completions", "openai-chat"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm")
    return tiny_lm_folder(root, "gpt2").rename(root / MODEL)


def serving(folder, batcher: str):
    settings = Settings(
        model=str(folder), batcher=batcher, device="cpu", max_batch_size=8, max_queue_delay_ms=5,
        lm_kv_blocks=256, lm_block_size=8, lm_token_budget=64,
    )  # fmt: skip
    return threaded_server(settings)


@pytest.fixture(scope="module")
def server(folder):
    """Token-level (continuous) batching: one streamed event per token."""
    with serving(folder, "continuous") as (url, _app):
        yield url


def loadgen(url: str, out, *args: str) -> dict:
    """``python -m wattserve loadgen`` as a user runs it; returns results.json."""
    cmd = [sys.executable, "-m", "wattserve", "loadgen", "--url", url, "--model", MODEL, "--no-progress",
           "--out", str(out), *args]  # fmt: skip
    env = {**os.environ, "COLUMNS": "200"}  # the table's header on one line
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    printed = done.stdout + done.stderr
    assert done.returncode == 0, printed[-6000:]
    assert "TTFT p50" in printed and "counted by" in printed  # the language-model table
    return json.loads((out / "results.json").read_text())


def rows(out) -> list[dict[str, str]]:
    with (out / "requests.csv").open() as f:
        return list(csv.DictReader(f))


def server_tokens(url: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    return sum(
        s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == "wattserve_lm_output_tokens_total" and s.labels.get("model") == MODEL
    )


@pytest.mark.parametrize("api", APIS)
def test_open_loop_every_request_answered_with_ttft_within_latency(server, tmp_path, api):
    doc = loadgen(server, tmp_path, "--api", api, "--arrival", "poisson", "--rate", "6", "--warmup", "0.5",
                  "--duration", "2", "--prompt-len", "uniform:3,12", "--output-len", "fixed:6",
                  "--ignore-eos", "--seed", "3")  # fmt: skip
    run = doc["runs"][0]
    assert run["sent"] > 0 and run["completed"] == run["sent"] and run["failed"] == 0
    assert run["target"]["workload"]["api"] == api
    lm = run["lm"]
    assert lm["ttft_ms"]["count"] == run["completed"]
    assert lm["token_source"] == (["events"] if api == "generate" else ["usage"])
    assert lm["ttft_ms"]["p50"] <= lm["latency_ms"]["p50"] and lm["output_tokens_per_s"] > 0
    assert lm["tpot_ms"]["p50"] > 0
    server_lm = run["server"]["lm"]  # the server's view of the same window, from /metrics
    assert server_lm["output_tokens"] > 0 and server_lm["mean_ttft_ms"] > 0
    joules = server_lm["energy_per_output_token_j"]  # None where nothing is metered (no RAPL, no GPU)
    assert joules is None or joules > 0
    measured = [r for r in rows(tmp_path) if r["phase"] == "measure"]
    assert len(measured) == run["sent"]
    for r in measured:
        assert r["status"] == "200"
        assert 0 < float(r["ttft_ms"]) <= float(r["latency_ms"])
        tokens = int(r["output_tokens"])
        # generate takes ignore_eos: exactly max_tokens; OpenAI's route may stop at the end token
        assert tokens == 6 if api == "generate" else 1 <= tokens <= 6
        assert int(r["prompt_tokens"]) >= 1
        if tokens > 1:  # token by token: one event each, so a time per token
            assert float(r["tpot_ms"]) >= 0
    assert sum(int(r["output_tokens"]) for r in measured) == lm["output_tokens"]
    with (tmp_path / "summary.csv").open() as f:
        summary = next(csv.DictReader(f))
    assert float(summary["ttft_p99_ms"]) >= float(summary["ttft_p50_ms"]) > 0
    assert summary["token_source"] == lm["token_source"][0]
    assert "TTFT p99" in (tmp_path / "report.html").read_text()


@pytest.mark.parametrize("api", ["generate", "openai-completions"])
def test_the_tokens_counted_equal_the_servers(server, tmp_path, api):
    """Closed loop: no request is cut off at the end, so every token the server generated
    reached a record (and the probe's one)."""
    before = server_tokens(server)
    loadgen(server, tmp_path, "--api", api, "--arrival", "closed", "--concurrency", "3", "--warmup", "0",
            "--duration", "1.5", "--output-len", "uniform:2,10", "--temperature", "1", "--seed", "5")  # fmt: skip
    counted = sum(int(r["output_tokens"]) for r in rows(tmp_path) if r["status"] == "200")
    assert all(r["status"] == "200" for r in rows(tmp_path))
    assert counted > 0
    assert server_tokens(server) - before == counted + 1  # + the one-token probe


def test_request_level_batching_counts_each_whole_answer_and_has_no_tpot(folder, tmp_path):
    """Dynamic batching streams one event per answer, its output_ids padded with -1 to the
    batch's longest: the ids counted still equal the server's tokens."""
    with serving(folder, "dynamic") as (url, _app):
        before = server_tokens(url)
        doc = loadgen(url, tmp_path, "--api", "generate", "--arrival", "closed", "--concurrency", "3",
                      "--warmup", "0", "--duration", "1.5", "--output-len", "uniform:2,10", "--seed", "6")  # fmt: skip
        answered = rows(tmp_path)
        assert answered and all(r["status"] == "200" and r["tpot_ms"] == "" for r in answered)
        assert server_tokens(url) - before == sum(int(r["output_tokens"]) for r in answered) + 1
    lm = doc["runs"][0]["lm"]
    assert lm["tpot_ms"]["count"] == 0 and lm["ttft_ms"]["count"] == doc["runs"][0]["completed"]


def test_the_reader_counts_token_level_request_level_and_openai_streams():
    token_level = _Reader("generate")
    for at, (text, token) in enumerate([("", 5), ("he", 6), ("llo", 7)]):
        token_level.event({"text_output": text, "output_ids": token, "prompt_tokens": 4}, float(at))
    t = token_level.result()
    assert (t.tokens, t.token_source, t.first_s, t.last_s, t.prompt_tokens) == (3, "events", 1.0, 2.0, 4)
    assert (t.first_token_s, t.token_events) == (0.0, 3)  # TPOT runs from the first token, text or not
    whole = _Reader("generate")  # request-level batching: one event, the row padded with -1
    whole.event({"text_output": "hello", "output_ids": [5, 6, 7, -1, -1]}, 9.0)
    assert (whole.result().tokens, whole.result().first_s, whole.result().token_events) == (3, 9.0, 1)
    chat = _Reader("openai-chat")
    chat.event({"choices": [{"delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}, 0.0)
    chat.event({"choices": [{"delta": {"content": "hi"}, "finish_reason": None}]}, 1.0)
    chat.event({"choices": [{"delta": {"content": "!"}, "finish_reason": "length"}]}, 2.0)
    chat.event({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}, 3.0)
    c = chat.result()
    assert (c.tokens, c.token_source, c.first_s, c.last_s, c.prompt_tokens) == (2, "usage", 1.0, 2.0, 3)
    no_usage = _Reader("openai-completions")
    for at in range(3):
        no_usage.event({"choices": [{"text": "x", "finish_reason": None}]}, float(at))
    assert (no_usage.result().tokens, no_usage.result().token_source) == (3, "chunks")
    failed = _Reader("generate")
    failed.event({"error": "boom"}, 0.0)
    assert failed.error == "boom"


def test_language_model_options_without_api_are_refused_in_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["loadgen", "--model", MODEL, "--rate", "1", "--prompt-len", "fixed:8"])
    assert exc.value.code == 2
    assert "--prompt-len: language-model options need --api" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["loadgen", "--model", MODEL, "--rate", "1", "--api", "generate", "--json"])
