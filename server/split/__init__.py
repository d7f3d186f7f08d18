"""Front ends across processes over one engine core (``--frontend-workers N``, N >= 2).

The per-request work (HTTP and gRPC parsing, decoding, validation, encoding) runs in N
front-end processes that share the public ports (SO_REUSEPORT); every model's queue,
batcher and engine instances live in one engine-core process, so every request of a model
can meet every other in one batch. Tensors cross between them in shared memory (a slab per
front end, offsets over a Unix socket), never pickled. ``supervisor`` starts and restarts
both kinds; ``wattserve serve --frontend-workers 1`` (the default) keeps one process.
"""
