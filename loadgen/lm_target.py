"""A language model as the load generator's target: readiness for the chosen API, the
streamed request bodies of every item, and one probe that must stream a token."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import aiohttp

from . import client, lm_client
from .lm_workload import LMItem
from .runner import PROBE_TIMEOUT_S, Target
from .stats import OK


async def prepare_lm_target(
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    api: str,
    items: Sequence[LMItem],
    workload: dict[str, Any],
    ready_timeout_s: float = 60.0,
    metrics_url: str | None = "",
    temperature: float | None = 0.0,
    ignore_eos: bool = False,
) -> Target:
    """Wait for the server (``/v2/health/ready`` for generate; ``/v1/models`` listing the
    model for OpenAI, which has no readiness route), build one request per item (sent round
    robin) and probe with a one-token request: a refusal stops the run with its answer.
    ``metrics_url``: "" for ``{url}/metrics``, None to read none."""
    url = url.rstrip("/")
    metadata: dict[str, Any] = {}
    if api == "generate":
        await client.wait_ready(session, url, ready_timeout_s)
        metadata = await client.get_json(session, f"{url}/v2/models/{model}")
    else:
        listed = await client.get_json(session, f"{url}/v1/models")
        names = [m.get("id") for m in listed.get("data", []) if isinstance(m, dict)]
        if model not in names:
            raise RuntimeError(f"{url}/v1/models does not list {model!r} (it lists {names})")
        metadata = {"platform": "openai"}
    reqs = [lm_client.lm_request(api, model, it, temperature, ignore_eos) for it in items]
    probe = lm_client.lm_request(api, model, LMItem(items[0].prompt, 1), temperature, ignore_eos)
    out = await lm_client.send_stream(session, url, probe, keep_detail=True, timeout_s=PROBE_TIMEOUT_S * 12)
    if out.status != OK:
        raise RuntimeError(
            f"probe request to {model} ({api}) failed: {out.status} {out.detail or ''}".strip()
        )
    if metrics_url == "":
        metrics_url = f"{url}/metrics"
    if metrics_url and await client.get_text(session, metrics_url) is None:
        metrics_url = None
    return Target(url, model, api, reqs, metrics_url or None, metadata, lm_client.send_stream, workload)
