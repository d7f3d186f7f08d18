"""The client half of scripts/check_image.sh: tritonclient against a running wattserve image.

  python scripts/image_client.py infer HTTP_PORT GRPC_PORT MODEL
      one request over HTTP and one over gRPC, inputs from the model's own metadata; the two
      answers must agree
  python scripts/image_client.py drain HTTP_PORT MODEL N -- STOP_COMMAND...
      N requests in flight (the model must be slow: identity_delay_ms), then STOP_COMMAND
      (e.g. podman kill --signal TERM NAME); every accepted request must be answered 200
  python scripts/image_client.py prometheus PROM_PORT DASHBOARD_JSON
      a Prometheus scraping the image (deploy/prometheus/prometheus.yml's job): its target is
      up, and every query of the Grafana dashboard runs there; prints how many return data
Exits non-zero, with the reason, when a check fails.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

DTYPES = {"FP32": np.float32, "FP16": np.float16, "INT64": np.int64, "INT32": np.int32, "UINT8": np.uint8}


def wait_ready(http_port: int, timeout_s: float) -> None:
    """Poll /v2/health/ready (what the image's HEALTHCHECK asks) until 200."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/health/ready", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise SystemExit(f"not ready after {timeout_s:.0f} s")


def _inputs(metadata: dict, module: type) -> list:
    tensors = []
    rng = np.random.default_rng(0)
    for spec in metadata["inputs"]:
        shape = [1 if int(d) < 0 else int(d) for d in spec["shape"]]
        data = rng.random(shape).astype(DTYPES[spec["datatype"]])
        tensor = module(spec["name"], shape, spec["datatype"])
        tensor.set_data_from_numpy(data)
        tensors.append(tensor)
    return tensors


def infer(http_port: int, grpc_port: int, model: str) -> None:
    http = httpclient.InferenceServerClient(f"127.0.0.1:{http_port}")
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    assert http.is_server_ready() and grpc.is_server_ready()
    metadata = http.get_model_metadata(model)
    names = [o["name"] for o in metadata["outputs"]]
    by_http = http.infer(model, _inputs(metadata, httpclient.InferInput))
    by_grpc = grpc.infer(model, _inputs(metadata, grpcclient.InferInput))
    for name in names:
        a, b = by_http.as_numpy(name), by_grpc.as_numpy(name)
        assert a is not None and b is not None, name
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        print(
            f"{model}: {name} {list(a.shape)} {a.dtype} HTTP == gRPC (first values {a.ravel()[:3].tolist()})"
        )


def drain(http_port: int, model: str, n: int, stop: list[str]) -> None:
    metadata = httpclient.InferenceServerClient(f"127.0.0.1:{http_port}").get_model_metadata(model)
    results: list[str] = []

    def one() -> None:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{http_port}", network_timeout=120)
        try:
            client.infer(model, _inputs(metadata, httpclient.InferInput))
            results.append("200")
        except Exception as error:  # a failed request is the finding, whatever its type
            results.append(f"failed: {error}")

    threads = [threading.Thread(target=one) for _ in range(n)]
    for thread in threads:
        thread.start()
    time.sleep(0.5)  # the requests reach the server's queue before the signal
    started = time.monotonic()
    subprocess.run(stop, check=True)
    print(f"sent: {' '.join(stop)}")
    for thread in threads:
        thread.join()
    print(f"{n} requests in flight at SIGTERM: {results.count('200')} answered 200 "
          f"within {time.monotonic() - started:.1f} s of the signal")  # fmt: skip
    failed = [r for r in results if r != "200"]
    if failed:
        raise SystemExit(f"lost in the drain: {failed}")


def _query(prom_port: int, expr: str) -> dict:
    url = f"http://127.0.0.1:{prom_port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def prometheus(prom_port: int, dashboard: str, timeout_s: float = 60) -> None:
    """The compose stack's Prometheus half: the scrape works and the dashboard's queries run."""
    deadline = time.monotonic() + timeout_s
    up: list = []
    while time.monotonic() < deadline:
        try:
            up = _query(prom_port, 'up{job="wattserve",deployment="compose"} == 1')["data"]["result"]
        except OSError:
            up = []
        if up:
            break
        time.sleep(1)
    if not up:
        raise SystemExit("Prometheus does not see the wattserve target up")
    print(f"Prometheus: target {up[0]['metric']['instance']} up (job wattserve, deployment compose)")
    series = _query(prom_port, 'count({__name__=~"wattserve_.+"})')["data"]["result"]
    print(f"Prometheus: {series[0]['value'][1] if series else 0} wattserve_* series scraped")
    panels = json.loads(Path(dashboard).read_text())["panels"]
    exprs = [t["expr"] for p in panels for t in p.get("targets", []) if "expr" in t]
    with_data = 0
    for expr in exprs:
        for name, value in (("$__rate_interval", "15s"), ("$model", ".*"), ("$batcher", ".*")):
            expr = expr.replace(name, value)
        answer = _query(prom_port, expr)
        if answer["status"] != "success":
            raise SystemExit(f"dashboard query fails: {expr}: {answer}")
        with_data += bool(answer["data"]["result"])
    print(f"Grafana dashboard: {len(exprs)} queries run on Prometheus, {with_data} return data")


def main(argv: list[str]) -> None:
    command, *args = argv
    if command == "wait":
        wait_ready(int(args[0]), float(args[1]))
    elif command == "infer":
        infer(int(args[0]), int(args[1]), args[2])
    elif command == "drain":
        sep = args.index("--")
        drain(int(args[0]), args[1], int(args[2]), args[sep + 1 :])
    elif command == "prometheus":
        prometheus(int(args[0]), args[1])
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
