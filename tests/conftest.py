"""Fixtures shared across test modules."""

from tests.prometheus_fixture import prometheus_factory  # noqa: F401  (a real Prometheus on loopback)
