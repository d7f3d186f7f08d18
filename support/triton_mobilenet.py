"""Serve wattserve's torchvision model from Triton (via PyTriton), for the side-by-side benchmark.

Runs in its own virtualenv (PyTriton is no dependency of wattserve; see scripts/triton_venv.sh):

    LD_LIBRARY_PATH=$(/work/.venv-triton/bin/python -c 'import sys; print(sys.base_prefix)')/lib \\
    PYTHONPATH=. /work/.venv-triton/bin/python benchmarks/triton_mobilenet.py --http-port 8010

The model is built by wattserve's own ``engines.torch_engine.TorchVisionEngine`` (same seed,
same BatchNorm calibration, same channels_last), so both servers compute the same answers with
the same code; only the serving around it differs. Only that module is imported (it needs
torch, torchvision and numpy, nothing of the server). Triton's dynamic batcher gets the same
max batch and max queue delay as wattserve's, one model instance, the same torch thread count.
The ``LD_LIBRARY_PATH`` is needed here: without the interpreter's own lib directory Triton's
Python backend stub fails on an RLock error.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import logging
import signal
import sys
from dataclasses import dataclass

log = logging.getLogger("triton_mobilenet")

INPUT_NAME, INPUT_SHAPE = "input", (3, 224, 224)  # engines.torch_engine.IMAGE_SPEC
OUTPUT_NAME, OUTPUT_SHAPE = "logits", (1000,)  # engines.torch_engine.LOGITS_SPEC


@dataclass(frozen=True)
class ServeConfig:
    """Everything the Triton side is configured with; built from the command line only."""

    model: str
    seed: int
    channels_last: bool
    torch_threads: int | None  # None: torch's default, as wattserve leaves it when unset
    max_batch_size: int
    max_queue_delay_us: int
    instances: int
    http_port: int
    grpc_port: int
    metrics_port: int
    tune_malloc: bool
    warmup: bool
    engine_thread: bool = True  # build, warm and run each engine on one thread of its own

    def dynamic_batcher(self) -> dict[str, int]:
        """The fields of Triton's dynamic_batching message this run sets."""
        return {"max_queue_delay_microseconds": self.max_queue_delay_us}


def parse_args(argv: list[str] | None = None) -> ServeConfig:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="mobilenet_v2")
    p.add_argument("--seed", type=int, default=0, help="weights seed (wattserve's WATTSERVE_SEED)")
    p.add_argument("--no-channels-last", dest="channels_last", action="store_false")
    p.add_argument("--torch-threads", type=int, default=None, help="unset: torch's default")
    p.add_argument("--max-batch-size", type=int, default=8)
    p.add_argument("--max-queue-delay-ms", type=float, default=5.0)
    p.add_argument("--instances", type=int, default=1)
    p.add_argument("--http-port", type=int, default=8000)
    p.add_argument("--grpc-port", type=int, default=8001)
    p.add_argument("--metrics-port", type=int, default=8002)
    p.add_argument(
        "--no-tune-malloc",
        dest="tune_malloc",
        action="store_false",
        help="leave glibc's allocator at its defaults in the model process (wattserve tunes it)",
    )
    p.add_argument("--no-warmup", dest="warmup", action="store_false")
    p.add_argument(
        "--no-engine-thread",
        dest="engine_thread",
        action="store_false",
        help="build the engine on the main thread and call it from PyTriton's handler thread",
    )
    a = p.parse_args(argv)
    if a.max_batch_size < 1 or a.instances < 1 or a.max_queue_delay_ms < 0:
        p.error("max batch and instances must be >= 1, the delay >= 0")
    return ServeConfig(
        model=a.model,
        seed=a.seed,
        channels_last=a.channels_last,
        torch_threads=a.torch_threads,
        max_batch_size=a.max_batch_size,
        max_queue_delay_us=round(a.max_queue_delay_ms * 1000),
        instances=a.instances,
        http_port=a.http_port,
        grpc_port=a.grpc_port,
        metrics_port=a.metrics_port,
        tune_malloc=a.tune_malloc,
        warmup=a.warmup,
        engine_thread=a.engine_thread,
    )


def tune_malloc() -> bool:
    """The same glibc settings wattserve's server.lifecycle.tune_malloc applies (no mmap,
    one arena, no trimming), so the model computes under the same allocator in both servers.
    Repeated here because importing server.lifecycle needs uvicorn, absent from this venv."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    mallopt = ctypes.CDLL(name).mallopt
    # M_MMAP_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX, M_TRIM_THRESHOLD, M_TOP_PAD (malloc.h)
    wanted = ((-3, 32 * 1024 * 1024), (-4, 0), (-8, 1), (-1, 1 << 30), (-2, 64 * 1024 * 1024))
    return all(mallopt(param, value) == 1 for param, value in wanted)


class EngineOnItsThread:
    """An engine built, warmed and called on one thread of its own, as wattserve runs its
    engines (``batchers.base.engine_thread``): torch's OpenMP keeps a worker team per calling
    thread, and an engine built on the main thread but called from PyTriton's handler thread
    would leave two teams, whose workers then sleep between parallel regions on a small
    machine. The hop costs Triton's side one thread hand-off per batch."""

    def __init__(self, build) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")
        self.engine = self._thread.submit(build).result()

    def infer(self, batch):
        return self._thread.submit(self.engine.infer, batch).result()


def build_engines(cfg: ServeConfig) -> list:
    """One wattserve TorchVisionEngine per instance, each on its own thread (unless
    ``--no-engine-thread``), warmed at every batch size."""
    import numpy as np
    from wattserve.engines.torch_engine import TorchVisionEngine

    def build() -> TorchVisionEngine:
        return TorchVisionEngine(
            cfg.model,
            device="cpu",
            seed=cfg.seed,
            channels_last=cfg.channels_last,
            max_batch_size=cfg.max_batch_size,
            threads=cfg.torch_threads,
        )

    engines = [EngineOnItsThread(build) if cfg.engine_thread else build() for _ in range(cfg.instances)]
    if cfg.warmup:  # wattserve warms every batch size its batcher may form before it is ready
        x = np.zeros((cfg.max_batch_size, *INPUT_SHAPE), dtype=np.float32)
        for engine in engines:
            for size in range(1, cfg.max_batch_size + 1):
                engine.infer({INPUT_NAME: x[:size]})
    return engines


def serve(cfg: ServeConfig) -> None:
    import numpy as np
    from pytriton.decorators import batch
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig

    engines = build_engines(cfg)

    def make_infer(engine):
        @batch
        def infer(**inputs):
            return {OUTPUT_NAME: engine.infer({INPUT_NAME: inputs[INPUT_NAME]})["logits"]}

        return infer

    infer_funcs = [make_infer(e) for e in engines]
    triton_config = TritonConfig(
        http_address="127.0.0.1",
        http_port=cfg.http_port,
        grpc_address="127.0.0.1",
        grpc_port=cfg.grpc_port,
        metrics_port=cfg.metrics_port,
    )
    with Triton(config=triton_config) as triton:
        triton.bind(
            model_name=cfg.model,
            infer_func=infer_funcs if len(infer_funcs) > 1 else infer_funcs[0],
            inputs=[Tensor(name=INPUT_NAME, dtype=np.float32, shape=INPUT_SHAPE)],
            outputs=[Tensor(name=OUTPUT_NAME, dtype=np.float32, shape=OUTPUT_SHAPE)],
            config=ModelConfig(
                max_batch_size=cfg.max_batch_size,
                batcher=DynamicBatcher(**cfg.dynamic_batcher()),
            ),
            strict=False,
        )
        # SIGTERM (the benchmark's stop) ends serve() the way Ctrl-C does: Triton is stopped
        # and its workspace cleaned, not left running as an orphan.
        signal.signal(signal.SIGTERM, signal.default_int_handler)
        log.info("serving %s on http://127.0.0.1:%d", cfg.model, cfg.http_port)
        triton.serve()  # returns when Triton or the proxy backend dies, or on a signal


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    cfg = parse_args(argv)
    if cfg.tune_malloc:
        log.info("glibc malloc tuned as wattserve does: %s", tune_malloc())
    log.info("config: %s", cfg)
    serve(cfg)


if __name__ == "__main__":
    sys.exit(main())
