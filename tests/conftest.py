"""Fixtures shared across test modules."""

from tests.prometheus_fixture import prometheus_factory  # noqa: F401  (a real Prometheus on loopback)
from tests.serial_lock import pytest_runtest_protocol  # noqa: F401  (tests marked serial run alone under xdist)
