"""Triton's server extensions, protocol-neutral: each front end exposes them in its own wire form.

``shared_memory`` (system regions) and ``cuda_ipc`` (CUDA regions), ``trace_logging``,
``classification``, ``statistics`` (per-model counters), ``triton_metrics`` (the ``nv_*``
Prometheus names), ``errors`` (an extension's refusal: Triton's message and kind).
"""
