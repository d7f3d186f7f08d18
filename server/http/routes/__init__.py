"""The HTTP front end: routers by concern, each built from the model set (and settings) it serves.

``inference`` (KServe infer, the hot path), ``health`` (server/model metadata, readiness,
config, statistics, /metrics), ``repository`` (Triton's model-repository extension),
``images`` (image classification upload, diffusion PNG). They share ``common`` (answers, the
gone-client watch) and ``body`` (body reading within limits: the only Starlette request
reading) over the protocol-neutral core in ``server.core``; none imports ``server.app``.
"""
