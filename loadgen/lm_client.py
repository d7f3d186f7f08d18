"""The streaming side of the generator for language models: request bodies for Triton's
``generate_stream`` and OpenAI's ``/v1/completions`` and ``/v1/chat/completions`` (stream=true),
and one call that reads the Server-Sent Events and times the tokens.

Every event is read as it arrives (``perf_counter`` at its line): the first one holding text
is the first token, the last one carrying a token ends the generation. Output tokens are the
server's own count where it gives one: OpenAI's ``usage`` (asked for with
``stream_options.include_usage``), else one generate_stream event per token (a whole answer in
one event, as under request-level batching, counts its ``output_ids``).
"""

from __future__ import annotations

import time
from typing import Any

import aiohttp
import orjson

from .client import Outcome
from .lm_workload import LMItem
from .payloads import PreparedRequest
from .stats import OK, StreamTimes

APIS = ("generate", "openai-completions", "openai-chat")
JSON_HEADERS = {"Content-Type": "application/json"}
now = time.perf_counter


def lm_request(
    api: str,
    model: str,
    item: LMItem,
    temperature: float | None = 0.0,
    ignore_eos: bool = False,
) -> PreparedRequest:
    """One item as the API's streaming request. ``ignore_eos`` is sent as a field of the body
    (Triton's vLLM backend and wattserve's generate take it; OpenAI's API has no such field)."""
    body: dict[str, Any]
    if api == "generate":
        body = {"text_input": item.prompt, "max_tokens": item.max_tokens, "stream": True}
        path = f"/v2/models/{model}/generate_stream"
    elif api in ("openai-completions", "openai-chat"):
        body = {"model": model, "max_tokens": item.max_tokens, "stream": True,
                "stream_options": {"include_usage": True}}  # fmt: skip
        if api == "openai-chat":
            body["messages"] = [{"role": "user", "content": item.prompt}]
            path = "/v1/chat/completions"
        else:
            body["prompt"] = item.prompt
            path = "/v1/completions"
    else:
        raise ValueError(f"unknown api {api!r}; expected one of {APIS}")
    if temperature is not None:
        body["temperature"] = temperature
    if ignore_eos:
        body["ignore_eos"] = True
    return PreparedRequest(path, orjson.dumps(body), dict(JSON_HEADERS))


def api_of(req: PreparedRequest) -> str:
    if req.path.endswith("/generate_stream"):
        return "generate"
    return "openai-chat" if req.path.endswith("/chat/completions") else "openai-completions"


class _Reader:
    """Folds one stream's events into StreamTimes; ``error`` is set by an error event."""

    def __init__(self, api: str) -> None:
        self.api = api
        self.times = StreamTimes()
        self.tokens = 0
        self.usage: int | None = None
        self.error: str | None = None

    def event(self, doc: Any, at: float) -> None:
        if not isinstance(doc, dict):
            return
        if "error" in doc:
            self.error = str(doc["error"])[:500]
            return
        tokens, text = self._generate(doc) if self.api == "generate" else self._openai(doc)
        if tokens:
            self.tokens += tokens
            self.times.token_events += 1
            self.times.last_s = at
            if self.times.first_token_s is None:
                self.times.first_token_s = at
        if text and self.times.first_s is None:
            self.times.first_s = at

    def _generate(self, doc: dict[str, Any]) -> tuple[int, str]:
        ids = doc.get("output_ids")
        tokens = sum(1 for i in ids if i >= 0) if isinstance(ids, list) else int(ids is not None)
        if isinstance(doc.get("prompt_tokens"), int):
            self.times.prompt_tokens = doc["prompt_tokens"]
        text = doc.get("text_output")
        return tokens, text if isinstance(text, str) else ""

    def _openai(self, doc: dict[str, Any]) -> tuple[int, str]:
        usage = doc.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            self.usage = usage["completion_tokens"]
            if isinstance(usage.get("prompt_tokens"), int):
                self.times.prompt_tokens = usage["prompt_tokens"]
        choices = doc.get("choices") or []
        if not choices or not isinstance(choices[0], dict):
            return 0, ""
        choice = choices[0]
        if self.api == "openai-chat":
            delta = choice.get("delta") or {}
            if "content" not in delta:
                return 0, ""
            text = delta.get("content")
            # the first chunk of a chat names the role and carries no token
            if delta.get("role") and not text and choice.get("finish_reason") is None:
                return 0, ""
        else:
            text = choice.get("text")
        return 1, text if isinstance(text, str) else ""

    def result(self) -> StreamTimes:
        t = self.times
        if self.usage is not None:
            t.tokens, t.token_source = self.usage, "usage"
        else:
            t.tokens = self.tokens
            t.token_source = "events" if self.api == "generate" else "chunks"
        if t.first_s is None:  # no text at all (an empty answer): its first token then
            t.first_s = t.last_s
        return t


async def send_stream(
    session: aiohttp.ClientSession,
    base_url: str,
    req: PreparedRequest,
    keep_detail: bool = False,
    timeout_s: float | None = None,
) -> Outcome:
    """Send one streaming request and read every event; never raises for server or network
    errors (an error event is status ``stream_error``, an answer without a token
    ``no_tokens``)."""
    extra: dict[str, Any] = {}
    if timeout_s is not None:
        extra["timeout"] = aiohttp.ClientTimeout(total=timeout_s)
    reader = _Reader(api_of(req))
    try:
        async with session.post(base_url + req.path, data=req.body, headers=req.headers, **extra) as resp:
            if resp.status != 200:
                body = await resp.read()
                detail = body[:500].decode("utf-8", "replace") if keep_detail else None
                return Outcome(str(resp.status), detail=detail)
            async for raw in resp.content:
                at = now()
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                try:
                    reader.event(orjson.loads(data), at)
                except orjson.JSONDecodeError:
                    reader.error = f"not JSON: {data[:100]!r}"
    except TimeoutError:
        return Outcome("timeout")
    except aiohttp.ClientConnectionError as exc:
        return Outcome("connection_error", detail=str(exc) if keep_detail else None)
    except aiohttp.ClientError as exc:
        return Outcome("client_error", detail=str(exc) if keep_detail else None)
    times = reader.result()
    if reader.error is not None:
        return Outcome("stream_error", detail=reader.error, stream=times)
    if times.tokens < 1 or times.last_s is None:
        return Outcome("no_tokens", detail="the stream ended without a token", stream=times)
    return Outcome(OK, stream=times)
