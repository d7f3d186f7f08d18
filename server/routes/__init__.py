"""HTTP routers by concern, each built from the model set (and settings) it serves.

``inference`` (KServe infer, the hot path), ``health`` (server/model metadata, readiness,
config, statistics, /metrics), ``repository`` (Triton's model-repository extension),
``images`` (image classification upload, diffusion PNG). They share ``common`` and the
admission path in ``server.admission``; none imports ``server.app``.
"""
