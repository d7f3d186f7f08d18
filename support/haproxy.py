"""HAProxy in front of wattserve replicas: the configuration a balancer needs so a rolling
restart loses nothing (health checks on readiness, layer-7 retries of what a draining
replica refuses). Used by ``benchmarks.replicas`` (the deployment check) and its test,
which has haproxy validate it."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass

# Layer-7 retries: the request is re-sent to another replica when the connection fails, when
# the replica closes it without an answer (killed, or closing an idle keep-alive connection as
# it exits), or when it answers 503 (draining or queue full; wattserve never started the
# work). Inference is idempotent, so a retry is safe. Not 500/504: those are real answers.
L7_RETRY_ON = "conn-failure empty-response junk-response 503"
CONN_RETRY_ON = "conn-failure"


@dataclass
class BalancerSpec:
    backends: Sequence[int]  # replica ports
    l7_retries: bool = True
    check_inter_ms: int = 250  # health check interval; fall 1 / rise 1
    retries: int = 3
    balance: str = "leastconn"  # a busy replica (full queue, big batch) gets fewer new requests


def haproxy_config(spec: BalancerSpec, port: int, stats_port: int) -> str:
    """HAProxy 2.6 configuration: one frontend, the replicas as one backend, a stats page."""
    retry_on = L7_RETRY_ON if spec.l7_retries else CONN_RETRY_ON
    servers = "\n".join(f"    server r{i} 127.0.0.1:{p}" for i, p in enumerate(spec.backends))
    inter = spec.check_inter_ms
    return f"""global
    maxconn 4096

defaults
    mode http
    timeout connect 500ms
    timeout client 60s
    timeout server 60s
    timeout queue 30s
    timeout http-request 10s
    timeout http-keep-alive 10s
    # Retry a failed attempt up to {spec.retries} times, each on another replica (redispatch).
    retries {spec.retries}
    option redispatch 1
    retry-on {retry_on}

frontend wattserve
    bind 127.0.0.1:{port}
    default_backend replicas

backend replicas
    balance {spec.balance}
    # Out of rotation the moment readiness fails (draining or warming up), back when it passes.
    option httpchk GET /v2/health/ready
    http-check expect status 200
    default-server check inter {inter}ms fastinter {inter}ms downinter {inter}ms fall 1 rise 1
{servers}

frontend stats
    bind 127.0.0.1:{stats_port}
    stats enable
    stats uri /stats
"""


def haproxy_binary() -> str | None:
    """haproxy on PATH, or Debian's /usr/sbin (not on a non-root PATH)."""
    return shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin")
