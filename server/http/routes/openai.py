"""OpenAI-compatible routes for language models: ``POST /v1/completions``,
``POST /v1/chat/completions`` (one JSON answer, or Server-Sent Events with ``stream``) and
``GET /v1/models``, so the ``openai`` Python client works unmodified.

A body is translated into the model's generate inputs (``prompt`` -> ``text_input``,
``max_tokens``, ``temperature``, ``top_p``, ``top_k``, ``seed``, ``stop``) and takes the same
admission path as infer and generate (lookup, readiness, limits, 4xx before any queue, the
model's own batcher). A chat's messages become the prompt through the tokenizer folder's
chat template (``apply_chat_template``), or ``DEFAULT_CHAT_TEMPLATE`` when the folder has
none. Answers carry ``usage`` (prompt, completion and total tokens, counted by the model's
own tokenizer); a stream sends one chunk per piece of text as the engine generates it
(``token_sink``), then the finish reason (and ``usage`` with
``stream_options.include_usage``), then ``data: [DONE]``. Errors are OpenAI's shape,
``{"error": {"message", "type", "code"}}``. Only ``n`` = 1; ``logprobs``, ``echo`` and tools
are refused (400), not ignored.

OpenAI's default temperature is 1 (sampling); a request that wants greedy decoding says 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from wattserve.batchers.status import Status
from wattserve.engines.base import Engine
from wattserve.server.core.admission import Refused, admit
from wattserve.server.core.request import BadRequest, InferRequest
from wattserve.server.http.routes.body import read_upload
from wattserve.server.http.routes.common import watching_submit
from wattserve.server.http.routes.generate import SSE_MEDIA, parse_generate
from wattserve.server.http.status import HTTP_STATUS
from wattserve.server.models.model_set import ModelSet
from wattserve.server.models.runtime import ModelRuntime
from wattserve.server.settings import Settings

# For a tokenizer folder without a chat template: role-tagged lines, then the assistant's turn.
DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
REFUSED_FIELDS = ("logprobs", "echo", "tools", "functions", "best_of", "suffix")
SAMPLING = ("max_tokens", "temperature", "top_p", "top_k", "seed")


def openai_error(message: str, status: int) -> Response:
    kind = "invalid_request_error" if status < 500 else "server_error"
    doc = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return Response(orjson.dumps(doc), status_code=status, media_type="application/json")


def _loads(body: bytes) -> dict[str, Any]:
    try:
        doc = orjson.loads(body or b"{}")
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"malformed JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise BadRequest("the body must be a JSON object")
    return doc


def _prompt(doc: dict[str, Any]) -> str:
    prompt = doc.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise BadRequest("'prompt' must be a string (or a list of one string)")
    return prompt


def chat_prompt(engine: Any, messages: Any) -> str:
    """The chat's prompt text through the tokenizer's chat template (or the default one)."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list")
    for m in messages:
        if (
            not isinstance(m, dict)
            or not isinstance(m.get("role"), str)
            or not isinstance(m.get("content"), str)
        ):
            raise BadRequest("each message needs a string 'role' and a string 'content'")
    tokenizer = engine.tokenizer
    template = None if getattr(tokenizer, "chat_template", None) else DEFAULT_CHAT_TEMPLATE
    try:
        return str(
            tokenizer.apply_chat_template(
                messages, chat_template=template, tokenize=False, add_generation_prompt=True
            )
        )
    except Exception as exc:  # a template that raises on these messages: the client's 400
        raise BadRequest(f"the chat template failed on these messages: {exc}") from None


def generate_body(doc: dict[str, Any], prompt: str) -> dict[str, Any]:
    """The OpenAI fields as the model's generate inputs."""
    for name in REFUSED_FIELDS:
        if doc.get(name) not in (None, False, 0):
            raise BadRequest(f"'{name}' is not supported by wattserve")
    if doc.get("n", 1) != 1:
        raise BadRequest("only n = 1 is supported")
    body: dict[str, Any] = {"text_input": prompt, "temperature": 1.0}
    for name in SAMPLING:
        value = doc.get(name)
        if value is not None:
            body[name] = value
    if doc.get("max_completion_tokens") is not None:
        body["max_tokens"] = doc["max_completion_tokens"]
    stop = doc.get("stop")
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
            raise BadRequest("'stop' must be a string or a list of non-empty strings")
        body["stop"] = orjson.dumps(stops).decode()
    return body


def _usage(outputs: dict[str, Any]) -> dict[str, int]:
    prompt = int(outputs["prompt_tokens"].reshape(-1)[0])
    completion = int((outputs["output_ids"].reshape(-1) >= 0).sum())
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _text(outputs: dict[str, Any], name: str) -> str:
    return bytes(outputs[name].reshape(-1)[0]).decode("utf-8", "replace")


def openai_routes(models: ModelSet, settings: Settings) -> list[Route]:
    async def handle(request: Request, chat: bool) -> Response:
        loop = asyncio.get_running_loop()
        try:
            doc = _loads(await read_upload(request, settings.max_body_bytes))
        except BadRequest as exc:
            return openai_error(str(exc), HTTP_STATUS.get(exc.status, 400))
        except Exception as exc:
            status = getattr(exc, "status", Status.INVALID_ARG)
            return openai_error(str(exc), HTTP_STATUS.get(status, 400) if isinstance(status, Status) else 400)
        name = doc.get("model")
        if not isinstance(name, str):
            return openai_error("'model' must be a string", 400)
        streaming = bool(doc.get("stream", False))
        options = doc.get("stream_options") or {}
        include_usage = bool(isinstance(options, dict) and options.get("include_usage"))
        pieces: asyncio.Queue[tuple[str, str | None] | None] = asyncio.Queue()

        def sink(delta: str, _token: int, finish_reason: str | None, _prompt_tokens: int) -> None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(pieces.put_nowait, (delta, finish_reason))

        async def decode(runtime: ModelRuntime, _source: Any) -> tuple[InferRequest, Engine]:
            engine = runtime.engine
            if engine is None:
                raise BadRequest(f"model '{name}' is unloading", Status.UNAVAILABLE)
            if not getattr(engine, "streams_tokens", False):
                raise BadRequest(f"model '{name}' is not a language model")
            prompt = chat_prompt(engine, doc.get("messages")) if chat else _prompt(doc)
            decoded = parse_generate(orjson.dumps(generate_body(doc, prompt)), runtime, engine)
            if streaming:
                decoded.token_sink = sink
            return decoded, engine

        async def submit(runtime: ModelRuntime, item: Any, source: Request) -> Any:
            return await watching_submit(runtime, item, source)

        task = asyncio.ensure_future(admit(models, name, None, decode, request, submit))
        ident = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        created = int(time.time())
        obj = "chat.completion" if chat else "text_completion"
        if not streaming:
            try:
                admitted = await task
            except Refused as exc:
                return openai_error(str(exc), HTTP_STATUS[exc.status])
            outputs = admitted.result.outputs
            text, reason = _text(outputs, "text_output"), _text(outputs, "finish_reason")
            choice: dict[str, Any] = {"index": 0, "finish_reason": reason, "logprobs": None}
            if chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
            answer = {"id": ident, "object": obj, "created": created, "model": name, "choices": [choice],
                      "usage": _usage(outputs)}  # fmt: skip
            return Response(orjson.dumps(answer), media_type="application/json")

        task.add_done_callback(lambda _t: pieces.put_nowait(None))
        chunk_obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(
            delta: str | None, reason: str | None, usage: dict[str, int] | None = None, role: bool = False
        ) -> bytes:
            choices: list[dict[str, Any]] = []
            if delta is not None:
                choice: dict[str, Any] = {"index": 0, "finish_reason": reason, "logprobs": None}
                if chat:
                    choice["delta"] = {"role": "assistant", "content": delta} if role else {"content": delta}
                else:
                    choice["text"] = delta
                choices.append(choice)
            doc = {"id": ident, "object": chunk_obj, "created": created, "model": name, "choices": choices}
            if usage is not None:
                doc["usage"] = usage
            return b"data: " + orjson.dumps(doc) + b"\n\n"

        # The first piece (or the end, when admission refused it) decides the status.
        first = await pieces.get()
        refused = task.exception() if first is None else None
        if isinstance(refused, Refused):
            return openai_error(str(refused), HTTP_STATUS[refused.status])

        async def sse() -> AsyncIterator[bytes]:
            try:
                if chat:
                    yield chunk("", None, role=True)
                piece, streamed = first, False
                while piece is not None:
                    delta, reason = piece
                    streamed = True
                    yield chunk(delta, reason)
                    piece = await pieces.get()
                failure = task.exception()
                if failure is not None:
                    error = {"error": {"message": str(failure), "type": "server_error"}}
                    yield b"data: " + orjson.dumps(error) + b"\n\n"
                else:
                    outputs = task.result().result.outputs
                    if not streamed:  # request-level batching: the whole text at its end
                        yield chunk(_text(outputs, "text_output"), _text(outputs, "finish_reason"))
                    if include_usage:
                        yield chunk(None, None, _usage(outputs))
                yield b"data: [DONE]\n\n"
            finally:
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(BaseException):
                        await task

        return StreamingResponse(sse(), media_type=SSE_MEDIA)

    async def completions(request: Request) -> Response:
        return await handle(request, chat=False)

    async def chat_completions(request: Request) -> Response:
        return await handle(request, chat=True)

    async def list_models(_request: Request) -> Response:
        data = [
            {"id": rt.name, "object": "model", "created": 0, "owned_by": "wattserve"}
            for rt in models.runtimes()
            if getattr(rt.engine, "streams_tokens", False)
        ]
        return Response(orjson.dumps({"object": "list", "data": data}), media_type="application/json")

    return [
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/models", list_models, methods=["GET"]),
    ]
