"""Metrics of language models (token-level step engines), on the same registry as the rest.

- ``wattserve_lm_time_to_first_token_seconds``: arrival to the first generated token;
- ``wattserve_lm_time_per_output_token_seconds``: (last token - first token) / (tokens - 1)
  of each finished generation of two tokens or more;
- ``wattserve_lm_output_tokens_total`` / ``wattserve_lm_prompt_tokens_total``: tokens
  generated, and prompt tokens of the generations that started (``rate()``: tokens/s);
- ``wattserve_lm_preemptions_total``: running sequences preempted for KV blocks (recomputed);
- ``wattserve_lm_kv_cache_blocks{state="used"|"free"}``: the block pool now (scrape time);
- ``wattserve_lm_energy_per_output_token_joules``: the energy charged to this model's
  iterations (``wattserve_energy_batch_joules_sum``, each iteration's busy share of its
  counter windows) over the output tokens generated, both since start: each iteration's
  energy shared by the tokens it produced. Absent (no sample) while nothing is metered;
  energy lands one counter step after its iteration, so a short window reads low.

Running sequences are ``wattserve_running_states`` (batchers/iteration_metrics.py). The
engine reports every step's new tokens on its thread (``token_observer``); the server's
batch observer binds it (server/models/batch_observer.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from wattserve.telemetry.buckets import LATENCY_BUCKETS
from wattserve.telemetry.families import families
from wattserve.telemetry.histogram import BisectHistogram

ENERGY_SUM = "wattserve_energy_batch_joules_sum"


class _Families:
    """Declared once per registry however many language models it serves."""

    def __init__(self, r: CollectorRegistry) -> None:
        labels = ("model", "batcher")
        self.ttft = BisectHistogram(
            "wattserve_lm_time_to_first_token_seconds",
            "Arrival to the first generated token of a language-model request.",
            labels, buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.tpot = BisectHistogram(
            "wattserve_lm_time_per_output_token_seconds",
            "Mean time between output tokens of a finished generation (first to last).",
            labels, buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.output_tokens = Counter("wattserve_lm_output_tokens", "Tokens generated.", labels, registry=r)
        self.prompt_tokens = Counter(
            "wattserve_lm_prompt_tokens", "Prompt tokens of the generations that started.", labels, registry=r
        )
        self.preemptions = Counter(
            "wattserve_lm_preemptions",
            "Running sequences preempted for KV blocks (their cache freed, recomputed later).",
            labels,
            registry=r,
        )
        self.blocks = Gauge(
            "wattserve_lm_kv_cache_blocks", "KV cache blocks of the pool.", (*labels, "state"), registry=r
        )
        self.energy = _EnergyPerToken(r)
        r.register(self.energy)


class LMMetrics:
    """Token figures of one language model and batcher."""

    def __init__(self, model: str, batcher: str, registry: CollectorRegistry) -> None:
        f = families(registry, _Families)
        lv = (model, batcher)
        self.labels = lv
        self.registry = registry
        self.ttft = f.ttft.labels(*lv)
        self.tpot = f.tpot.labels(*lv)
        self.output_tokens = f.output_tokens.labels(*lv)
        self.prompt_tokens = f.prompt_tokens.labels(*lv)
        self.preemptions = f.preemptions.labels(*lv)
        self.used = f.blocks.labels(*lv, "used")
        self.free = f.blocks.labels(*lv, "free")
        self._energy = f.energy
        self._energy.models[lv] = self

    def token_observer(self, engine: Any) -> Callable[[Sequence[Any]], None]:
        """What ``engine.token_observer`` calls after each step (engine thread)."""
        seen = {"preemptions": engine.preemptions}

        def observe(grew: Sequence[Any]) -> None:
            if grew:
                self.output_tokens.inc(len(grew))
            for s in grew:
                if len(s.output) == 1:  # once per request: recompute never re-draws a token
                    self.prompt_tokens.inc(len(s.prompt))
                    self.ttft.observe(s.token_times[0] - s.arrival)
                if s.finish_reason is not None and len(s.token_times) > 1:
                    self.tpot.observe((s.token_times[-1] - s.token_times[0]) / (len(s.token_times) - 1))
            now = engine.preemptions
            if now > seen["preemptions"]:
                self.preemptions.inc(now - seen["preemptions"])
                seen["preemptions"] = now

        return observe

    def watch(self, engines: Sequence[Any]) -> None:
        self.used.set_function(lambda: sum(e.blocks.used for e in engines if e.model is not None))
        self.free.set_function(lambda: sum(e.blocks.free for e in engines if e.model is not None))
        for engine in engines:
            engine.token_observer = self.token_observer(engine)

    def unwatch(self) -> None:
        """The engines are going: the gauges let go of them."""
        self.used.set_function(lambda: 0)
        self.free.set_function(lambda: 0)
        if self._energy.models.get(self.labels) is self:  # a reload may have bound its own already
            del self._energy.models[self.labels]


class _EnergyPerToken(Collector):
    """Attributed iteration energy / output tokens of every language model of one registry,
    read at scrape time from the registry's own energy histogram."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.models: dict[tuple[str, str], LMMetrics] = {}
        self._inside = threading.local()  # collect() reads the registry, which collects this too

    def describe(self) -> list[GaugeMetricFamily]:
        return []  # names are not checked for duplicates; collect() is not run at registration

    def collect(self) -> list[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "wattserve_lm_energy_per_output_token_joules",
            "Energy charged to the model's iterations over the tokens they generated, since start.",
            labels=["model", "batcher", "source"],
        )
        if getattr(self._inside, "active", False) or not self.models:
            return [] if getattr(self._inside, "active", False) else [family]
        tokens = {lv: m.output_tokens._value.get() for lv, m in self.models.items()}
        self._inside.active = True
        try:
            energy = [
                sample
                for metric in self.registry.collect()
                if metric.name == ENERGY_SUM.removesuffix("_sum")
                for sample in metric.samples
                if sample.name == ENERGY_SUM
            ]
        finally:
            self._inside.active = False
        for sample in energy:
            lv = (sample.labels.get("model", ""), sample.labels.get("batcher", ""))
            if tokens.get(lv, 0) > 0:
                family.add_metric([*lv, sample.labels.get("source", "")], sample.value / tokens[lv])
        return [family]
