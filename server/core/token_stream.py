"""A language model's tokens, as the front ends stream them: one response per piece of text.

The engine (``engines/lm_engine.py``) calls a request's ``token_sink`` on its own thread for
every token it generates; ``token_sink`` here makes that sink, moving each token onto the
event loop as one response's outputs (Triton's LLM backends' shape: ``text_output`` the new
text alone, ``output_ids`` the one token, with the batch axis), so HTTP's
``generate_stream`` and gRPC's ``ModelStreamInfer`` build their messages from the same
arrays, in the order generated. The last token carries its ``finish_reason``; that is how a
front end knows it is the final response.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from collections.abc import Callable

import numpy as np

# (one response's outputs, final) -> None, on the event loop
Deliver = Callable[[dict[str, np.ndarray], bool], None]
# the engine's TokenSink: (new text, token, finish reason or None, prompt tokens)
Sink = Callable[[str, int, str | None, int], None]
Outputs = dict[str, np.ndarray]


def token_outputs(delta: str, token: int, finish_reason: str | None, prompt_tokens: int) -> Outputs:
    """One token's response, shaped as the engine's outputs with the batch axis."""
    return {
        "prompt_tokens": np.array([[prompt_tokens]], np.int32),
        "text_output": np.array([[delta.encode()]], dtype=object),
        "output_ids": np.array([[token]], np.int64),
        "finish_reason": np.array([[(finish_reason or "").encode()]], dtype=object),
    }


class _Mailbox:
    """Every token sink's calls bound for one loop, handed over in one loop callback per batch.

    A step of a language model generates one token for each of its running sequences; one
    ``call_soon_threadsafe`` per token would wake the loop (a self-pipe write and a loop turn)
    once per token. Here the engine thread appends to a list and schedules a flush only when
    none is pending, so a step's tokens cross over together, in the order generated; the
    flush is scheduled before the step returns, so it runs before the iteration is settled
    (the loop runs its callbacks in order) and a request's last token still precedes its end.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._calls: list[tuple[Callable[..., None], tuple[object, ...]]] = []
        self._pending = False

    def post(self, fn: Callable[..., None], *args: object) -> None:
        """Any thread: ``fn(*args)`` on the loop, after every call posted before it."""
        with self._lock:
            self._calls.append((fn, args))
            if self._pending:
                return
            self._pending = True
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody reads any more
            self._loop.call_soon_threadsafe(self._flush)

    def _flush(self) -> None:
        with self._lock:
            calls, self._calls, self._pending = self._calls, [], False
        for fn, args in calls:
            fn(*args)


_mailboxes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Mailbox] = weakref.WeakKeyDictionary()


def token_sink(loop: asyncio.AbstractEventLoop, deliver: Deliver) -> Sink:
    """A ``TokenSink`` for the engine thread that calls ``deliver`` on ``loop`` per token;
    ``final`` is True for the token that ended the generation. Made on the loop's thread."""
    mailbox = _mailboxes.get(loop)
    if mailbox is None:
        mailbox = _mailboxes[loop] = _Mailbox(loop)

    def on_loop(delta: str, token: int, finish_reason: str | None, prompt_tokens: int) -> None:
        deliver(token_outputs(delta, token, finish_reason, prompt_tokens), finish_reason is not None)

    def sink(delta: str, token: int, finish_reason: str | None, prompt_tokens: int) -> None:
        mailbox.post(on_loop, delta, token, finish_reason, prompt_tokens)

    return sink


def stream_wanted(parameters: dict[str, object] | None, inputs: dict[str, np.ndarray]) -> bool:
    """Whether to stream token by token: the ``stream`` input (BOOL, as Triton's vLLM and
    TensorRT-LLM backends take it) or the request parameter ``stream`` (False, ``"false"``
    or 0 ask for one answer with the whole text); neither: stream."""
    flag = inputs.get("stream")
    if flag is not None and flag.size:
        return bool(flag.ravel()[0])
    value = (parameters or {}).get("stream", True)
    if isinstance(value, str):
        return value.strip().lower() not in ("false", "0", "no", "off")
    return bool(value)
