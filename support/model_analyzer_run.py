"""Triton's Model Analyzer, remote mode, against a live wattserve: the run docs/model-analyzer.md
describes, end to end, for scripts/model_analyzer_check.sh and the conformance test.

It writes support/tool_models' repository, starts ``wattserve serve`` on it (explicit model
control, every model loaded: Model Analyzer loads each candidate configuration itself, through
the repository API with a config override), writes the YAML below with the server's ports, runs
``model-analyzer profile`` over a manual search (max_batch_size 4 and 8, concurrency 1 and 2,
plus the model's own configuration, which Model Analyzer always measures) and reads back the
inference table it exports.

    python -m support.model_analyzer_run --model-analyzer PATH --perf-analyzer PATH [--workdir DIR]
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from wattserve.loadgen.server_process import free_port, running_wattserve

from support.tool_models import make_tool_repository

MODEL = "add"
MAX_BATCH_SIZES = (4, 8)
CONCURRENCIES = (1, 2)

CONFIG_TEMPLATE = """\
# Model Analyzer {ma_version}, remote mode, against wattserve (docs/model-analyzer.md).
triton_launch_mode: remote
triton_http_endpoint: 127.0.0.1:{http_port}
triton_grpc_endpoint: 127.0.0.1:{grpc_port}
# wattserve's Prometheus metrics are on its HTTP port (Triton has a separate port, 8002)
triton_metrics_url: http://127.0.0.1:{http_port}/metrics
client_protocol: grpc
perf_analyzer_path: {perf_analyzer}
perf_analyzer_flags:
  measurement-interval: 1000
  max-trials: 5
  stability-percentage: 500
run_config_search_disable: true
override_output_model_repository: true
output_model_repository_path: {workdir}/output_models
export_path: {workdir}/export
checkpoint_directory: {workdir}/checkpoints
profile_models:
  {model}:
    cpu_only: true
    model_config_parameters:
      max_batch_size: [{batch_sizes}]
      dynamic_batching:
        max_queue_delay_microseconds: [200]
    parameters:
      concurrency: [{concurrencies}]
"""


@dataclass
class Run:
    """What one ``model-analyzer profile`` did."""

    returncode: int
    output: str
    seconds: float
    config_path: Path
    export_path: Path
    rows: list[dict[str, str]] = field(default_factory=list)  # metrics-model-inference.csv
    # the profiled model's configuration as the server applied it after the run (the last
    # candidate Model Analyzer loaded), or None if it is not loaded
    final_config: dict | None = None

    @property
    def summary_report(self) -> Path:
        return self.export_path / "reports" / "summaries" / MODEL / "result_summary.html"


def write_config(workdir: Path, http_port: int, grpc_port: int, perf_analyzer: Path, ma_version: str) -> Path:
    path = workdir / "model_analyzer.yaml"
    path.write_text(
        CONFIG_TEMPLATE.format(
            ma_version=ma_version, http_port=http_port, grpc_port=grpc_port, perf_analyzer=perf_analyzer,
            workdir=workdir, model=MODEL, batch_sizes=", ".join(map(str, MAX_BATCH_SIZES)),
            concurrencies=", ".join(map(str, CONCURRENCIES)),
        )
    )  # fmt: skip
    return path


def model_analyzer_version(model_analyzer: Path) -> str:
    done = subprocess.run([str(model_analyzer), "--version"], capture_output=True, text=True, timeout=60)
    return (done.stdout or done.stderr).strip().splitlines()[-1] if done.returncode == 0 else "?"


def served_config(url: str, model: str) -> dict | None:
    try:
        with urllib.request.urlopen(f"{url}/v2/models/{model}/config", timeout=10) as reply:
            return json.load(reply)
    except (urllib.error.URLError, OSError, ValueError):
        return None


def profile(model_analyzer: Path, perf_analyzer: Path, workdir: Path, timeout_s: float = 600) -> Run:
    """Start wattserve, run Model Analyzer against it, stop wattserve; what it did."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "export").mkdir(exist_ok=True)  # Model Analyzer refuses an export path that is missing
    repository = make_tool_repository(workdir / "repository")
    grpc_port = free_port()
    env = {
        "WATTSERVE_MODEL_REPOSITORY": str(repository),
        "WATTSERVE_GRPC_PORT": str(grpc_port),
        "WATTSERVE_TORCH_THREADS": "1",
        # Triton's --model-control-mode=explicit --load-model=*: Model Analyzer loads and
        # unloads the model it profiles (a setting main ignores until control modes land)
        "WATTSERVE_MODEL_CONTROL_MODE": "explicit",
        "WATTSERVE_LOAD_MODEL": "*",
    }
    with running_wattserve(env, ready_timeout_s=180) as server:
        config = write_config(
            workdir, server.port, grpc_port, perf_analyzer, model_analyzer_version(model_analyzer)
        )
        t0 = time.monotonic()
        try:
            done = subprocess.run(
                [str(model_analyzer), "profile", "-f", str(config)], capture_output=True, text=True,
                timeout=timeout_s, cwd=workdir,
            )  # fmt: skip
            returncode, output = done.returncode, done.stdout + done.stderr
        except subprocess.TimeoutExpired as exc:
            returncode, output = -1, f"timed out after {timeout_s} s\n{exc.stdout or ''}{exc.stderr or ''}"
        seconds = time.monotonic() - t0
        final_config = served_config(server.url, MODEL)
    run = Run(returncode, output, seconds, config, workdir / "export", final_config=final_config)
    table = run.export_path / "results" / "metrics-model-inference.csv"
    if table.is_file():
        with table.open() as f:
            run.rows = list(csv.DictReader(f))
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-analyzer", type=Path, required=True)
    parser.add_argument("--perf-analyzer", type=Path, required=True)
    parser.add_argument("--workdir", type=Path, default=None, help="default: a new temporary folder")
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="wattserve-model-analyzer-"))
    run = profile(args.model_analyzer, args.perf_analyzer, workdir.resolve())
    print(run.output)
    print(f"model-analyzer exited {run.returncode} after {run.seconds:.0f} s; config {run.config_path}")
    for row in run.rows:
        name, size, concurrency = row["Model Config Path"], row["Max Batch Size"], row["Concurrency"]
        rate, p99 = row["Throughput (infer/sec)"], row["p99 Latency (ms)"]
        print(
            f"  {name:<24} max_batch_size {size:>2} concurrency {concurrency} {rate:>8} infer/s p99 {p99} ms"
        )
    if run.returncode == 0 and run.summary_report.is_file():
        print(f"reports under {run.export_path / 'reports'}")
    return 0 if run.returncode == 0 and run.rows else 1


if __name__ == "__main__":
    sys.exit(main())
