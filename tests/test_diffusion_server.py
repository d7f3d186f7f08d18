"""The diffusion model through a real server on loopback (WATTSERVE_MODEL=tiny_unet).

Every concurrent request gets exactly one answer computed from its own seed and steps,
whichever batcher serves it; a SIGTERM drain answers every accepted request; the PNG
endpoint serves the same image as the KServe infer route.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import signal
from collections.abc import Iterator

import aiohttp
import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from wattserve.engines.diffusion import DiffusionEngine
from wattserve.server.settings import Settings

from tests.diffusion_support import quiet_cpu  # noqa: F401  (autouse fixture)
from tests.servers import threaded_server, wattserve_process

TOL = 1e-3  # same seed+steps, alone vs batched (tests/test_diffusion_engine.py)
MODEL = "tiny_unet"


@pytest.fixture(scope="module")
def reference() -> DiffusionEngine:
    """The server's model, built the same way (same seed -> same weights), run alone."""
    return DiffusionEngine(MODEL, device="cpu")


def solo(engine: DiffusionEngine, seed: int, steps: int) -> np.ndarray:
    b = {"seed": np.array([[seed]], np.int64), "steps": np.array([[steps]], np.int32)}
    return engine.infer(b)["image"][0]


def infer_body(seed: int, steps: int) -> dict:
    return {
        "inputs": [
            {"name": "seed", "shape": [1, 1], "datatype": "INT64", "data": [seed]},
            {"name": "steps", "shape": [1, 1], "datatype": "INT32", "data": [steps]},
        ]
    }


def image_of(doc: dict) -> np.ndarray:
    out = doc["outputs"][0]
    assert out["name"] == "image" and out["datatype"] == "FP32"
    assert out["shape"][0] == 1  # one request, its batch axis kept
    return np.asarray(out["data"], np.float32).reshape(out["shape"])[0]


@contextlib.contextmanager
def live(settings: Settings) -> Iterator[str]:
    """The real app (PNG route included) under uvicorn in a thread; yields its URL."""
    with threaded_server(settings) as (url, _app):
        yield url


async def fire(
    url: str, specs: list[tuple[int, int]], spacing_s: float = 0.0
) -> list[tuple[int, dict | str]]:
    """One infer request per (seed, steps), ``spacing_s`` apart; (status, body) each."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:

        async def one(i: int, seed: int, steps: int):
            await asyncio.sleep(i * spacing_s)
            async with session.post(f"{url}/v2/models/{MODEL}/infer", json=infer_body(seed, steps)) as r:
                return r.status, (await r.json() if r.status == 200 else await r.text())

        return await asyncio.gather(*(one(i, s, n) for i, (s, n) in enumerate(specs)))


def metric(url: str, name: str) -> float:
    for family in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for sample in family.samples:
            if sample.name == name:
                return sample.value
    raise AssertionError(f"{name} not in /metrics")


# 16 requests: static(4) forms only full batches, so a multiple of 4 all get answered.
SPECS = [(s, n) for s, n in zip(range(100, 116), [3, 8, 5, 1, 12, 6, 2, 9] * 2, strict=True)]


@pytest.mark.slow
@pytest.mark.parametrize("batcher", ["continuous", "dynamic", "static"])
def test_every_concurrent_request_gets_its_own_image(batcher, reference):
    # max_queue_wait_s=0: every request must be answered with its image, and on a loaded
    # machine 16 requests of up to 12 steps queue longer than the default 3 s time bound
    settings = Settings(model=MODEL, batcher=batcher, max_batch_size=4, max_queue_delay_ms=20,
                        torch_threads=1, log_level="warning", max_queue_wait_s=0)  # fmt: skip
    with live(settings) as url:
        answers = asyncio.run(fire(url, SPECS, spacing_s=0.01))
        state_steps = metric(url, "wattserve_iteration_state_steps_total")
        occupancy_max = max_occupancy(url)
    for (seed, steps), (status, doc) in zip(SPECS, answers, strict=True):
        assert status == 200, doc
        np.testing.assert_allclose(image_of(doc), solo(reference, seed, steps), atol=TOL, rtol=0)
    assert state_steps == sum(n for _, n in SPECS)  # every denoising step counted, once
    assert 1 < occupancy_max <= 4


def max_occupancy(url: str) -> float:
    for family in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        if family.name == "wattserve_iteration_batch_size":
            buckets = sorted(
                (float(s.labels["le"]), s.value) for s in family.samples if s.name.endswith("_bucket")
            )
            total = buckets[-1][1]
            return next(le for le, count in buckets if count == total)
    raise AssertionError("no wattserve_iteration_batch_size")


@pytest.mark.slow
def test_kserve_metadata_png_and_bad_requests(reference):
    settings = Settings(model=MODEL, batcher="continuous", max_batch_size=4, torch_threads=1,
                        log_level="warning")  # fmt: skip
    with live(settings) as url:
        meta = httpx.get(f"{url}/v2/models/{MODEL}").json()
        assert meta["inputs"] == [
            {"name": "seed", "datatype": "INT64", "shape": [-1, 1]},
            {"name": "steps", "datatype": "INT32", "shape": [-1, 1]},
        ]
        assert meta["outputs"] == [{"name": "image", "datatype": "FP32", "shape": [-1, 3, 32, 32]}]

        r = httpx.post(f"{url}/v2/models/{MODEL}/infer", json=infer_body(3, 6), timeout=60)
        assert r.status_code == 200
        assert r.headers["x-batch-size"] == "1"
        image = image_of(r.json())

        png = httpx.get(f"{url}/v2/models/{MODEL}/generate", params={"seed": 3, "steps": 6, "scale": 4})
        assert png.status_code == 200 and png.headers["content-type"] == "image/png"
        assert "x-compute-time-ms" in png.headers
        from PIL import Image

        picture = np.asarray(Image.open(io.BytesIO(png.content)))
        assert picture.shape == (128, 128, 3)
        expected = np.rint(image.transpose(1, 2, 0) * 255).astype(np.int16)
        assert np.abs(picture[::4, ::4].astype(np.int16) - expected).max() <= 1

        for params in ({"steps": 5000}, {"seed": -1}, {"scale": 99}):
            assert httpx.get(f"{url}/v2/models/{MODEL}/generate", params=params).status_code in (400, 422)
        assert httpx.get(f"{url}/v2/models/nope/generate").status_code == 404
        bad = httpx.post(f"{url}/v2/models/{MODEL}/infer", json=infer_body(1, 5000), timeout=60)
        assert bad.status_code == 400, bad.text
        assert metric(url, "wattserve_running_states") == 0


@pytest.mark.slow
def test_sigterm_drain_answers_every_running_and_queued_request(reference):
    env = {
        "WATTSERVE_MODEL": MODEL,
        "WATTSERVE_BATCHER": "continuous",
        "WATTSERVE_MAX_BATCH_SIZE": "4",
        "WATTSERVE_LOG_LEVEL": "info",
        "WATTSERVE_TORCH_THREADS": "1",  # see tests/diffusion_support.py
        # This checks that drain answers everything, not how fast: on a busy shared machine
        # the 12 requests took longer than the default 30 s and the rest were (rightly) failed.
        "WATTSERVE_DRAIN_TIMEOUT_S": "300",
    }
    server = wattserve_process(env).start()
    specs = [(200 + i, 15 + i) for i in range(12)]  # 4 running, 8 queued at SIGTERM
    try:
        server.wait_ready()

        async def scenario():
            load = asyncio.create_task(fire(server.url, specs))
            await asyncio.sleep(0.5)
            server.proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.2)
            late: list[int | str] = []
            async with httpx.AsyncClient(timeout=10) as client:
                try:
                    r = await client.post(f"{server.url}/v2/models/{MODEL}/infer", json=infer_body(1, 2))
                    late.append(r.status_code)
                except httpx.TransportError as exc:  # already closed: also a refusal
                    late.append(type(exc).__name__)
            return await load, late

        answers, late = asyncio.run(scenario())
        assert 200 not in late, late
        for (seed, steps), (status, doc) in zip(specs, answers, strict=True):
            assert status == 200, doc
            np.testing.assert_allclose(image_of(doc), solo(reference, seed, steps), atol=TOL, rtol=0)
        assert server.proc.wait(60) == 0
    finally:
        server.stop()


@pytest.mark.slow
@pytest.mark.parametrize("batcher", ["static", "dynamic"])
def test_bad_steps_are_refused_before_queueing_by_request_level_batchers(batcher):
    settings = Settings(model=MODEL, batcher=batcher, max_batch_size=2, torch_threads=1,
                        log_level="warning", warmup=False)  # fmt: skip
    with live(settings) as url:
        bad = httpx.post(f"{url}/v2/models/{MODEL}/infer", json=infer_body(1, 5000), timeout=60)
        assert bad.status_code == 400 and "steps" in bad.json()["error"]
        assert metric(url, "wattserve_inferences_total") == 0  # never reached a batch
