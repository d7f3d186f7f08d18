"""Metric families declared once per registry, however many models bind children of them.

A Prometheus registry refuses a second family of one name, yet many models (and every
reload of one) share one registry, one ``/metrics``. So each group of families is a class
whose constructor declares them on a registry, and ``families(registry, Group)`` returns
the one instance of it for that registry, declaring it on first use. The serving metrics
(``server/models/metrics.py``) and the iteration metrics (``batchers/iteration_metrics.py``) both
declare theirs through it; a registry's groups go with the registry (weak keys).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, TypeVar, cast

from prometheus_client import CollectorRegistry

Group = TypeVar("Group")

_DECLARED: weakref.WeakKeyDictionary[CollectorRegistry, dict[Callable[..., Any], Any]] = (
    weakref.WeakKeyDictionary()
)


def families(registry: CollectorRegistry, declare: Callable[[CollectorRegistry], Group]) -> Group:
    """The families ``declare`` declares on ``registry``: declared once, then the same object."""
    groups = _DECLARED.get(registry)
    if groups is None:
        groups = _DECLARED[registry] = {}
    group = groups.get(declare)
    if group is None:
        group = groups[declare] = declare(registry)
    return cast(Group, group)
