"""Serve an identity model (INPUT0 -> OUTPUT0, FP32) from Triton through PyTriton, with the
same optional delay as wattserve's identity engine, for ``benchmarks.accelerator_ceiling``.

Runs in Triton's own virtualenv (scripts/triton_venv.sh), not wattserve's:

    LD_LIBRARY_PATH=$(/work/.venv-triton/bin/python -c 'import sys; print(sys.base_prefix)')/lib \\
    /work/.venv-triton/bin/python benchmarks/triton_identity.py --http-port 8010 --grpc-port 8011

Triton's C++ front end and core parse, batch and encode; PyTriton's Python side runs the
model (a copy, after ``--delay-ms`` + ``--delay-per-item-ms`` x batch of sleep, as wattserve's
``IdentityEngine`` does). Its dynamic batcher gets ``--max-batch-size`` and no queue delay.
"""

from __future__ import annotations

import argparse
import logging
import signal
import time

log = logging.getLogger("triton_identity")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--elements", type=int, default=16)
    p.add_argument("--max-batch-size", type=int, default=256)
    p.add_argument("--delay-ms", type=float, default=0.0)
    p.add_argument("--delay-per-item-ms", type=float, default=0.0)
    p.add_argument("--http-port", type=int, default=8010)
    p.add_argument("--grpc-port", type=int, default=8011)
    p.add_argument("--metrics-port", type=int, default=8012)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    import numpy as np
    from pytriton.decorators import batch
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig

    @batch
    def infer(INPUT0):
        delay = (args.delay_ms + args.delay_per_item_ms * len(INPUT0)) / 1000.0
        if delay > 0:
            time.sleep(delay)
        return {"OUTPUT0": np.array(INPUT0, copy=True)}

    config = TritonConfig(
        http_address="127.0.0.1", http_port=args.http_port, grpc_address="127.0.0.1",
        grpc_port=args.grpc_port, metrics_port=args.metrics_port,
    )  # fmt: skip
    with Triton(config=config) as triton:
        triton.bind(
            model_name="identity",
            infer_func=infer,
            inputs=[Tensor(name="INPUT0", dtype=np.float32, shape=(args.elements,))],
            outputs=[Tensor(name="OUTPUT0", dtype=np.float32, shape=(args.elements,))],
            config=ModelConfig(
                max_batch_size=args.max_batch_size, batcher=DynamicBatcher(max_queue_delay_microseconds=0)
            ),
            strict=False,
        )
        signal.signal(signal.SIGTERM, signal.default_int_handler)  # stop Triton, clean its workspace
        log.info("serving identity on http://127.0.0.1:%d", args.http_port)
        triton.serve()


if __name__ == "__main__":
    main()
