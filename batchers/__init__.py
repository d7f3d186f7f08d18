"""Interchangeable batching policies behind one contract (see ``batchers.base``); each is
found by its own name in ``batchers.registry``."""

from wattserve.batchers.base import Batcher, BatcherConfig, RequestBatcher
from wattserve.batchers.continuous import ContinuousBatcher
from wattserve.batchers.dynamic import DynamicBatcher, DynamicConfig
from wattserve.batchers.iteration import IterationBatcher
from wattserve.batchers.observers import BatchObserver, BatchReport, NullObserver
from wattserve.batchers.static import StaticBatcher
from wattserve.batchers.types import (
    BatchFailed,
    DeadlineExceeded,
    Draining,
    QueueFull,
    QueueWaitExceeded,
    RequestError,
    Result,
    WorkItem,
)

__all__ = [
    "BatchFailed",
    "BatchObserver",
    "BatchReport",
    "Batcher",
    "BatcherConfig",
    "ContinuousBatcher",
    "DeadlineExceeded",
    "Draining",
    "DynamicBatcher",
    "DynamicConfig",
    "IterationBatcher",
    "NullObserver",
    "QueueFull",
    "QueueWaitExceeded",
    "RequestBatcher",
    "RequestError",
    "Result",
    "StaticBatcher",
    "WorkItem",
]
