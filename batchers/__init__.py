"""Interchangeable batching policies behind one contract (see ``batchers.base``)."""

from batchers.base import Batcher, BatcherConfig, RequestBatcher
from batchers.continuous import ContinuousBatcher
from batchers.dynamic import DynamicBatcher, DynamicConfig
from batchers.iteration import IterationBatcher
from batchers.static import StaticBatcher
from batchers.types import (
    BatchFailed,
    DeadlineExceeded,
    Draining,
    QueueFull,
    RequestError,
    Result,
    WorkItem,
)

__all__ = [
    "BatchFailed",
    "Batcher",
    "BatcherConfig",
    "ContinuousBatcher",
    "DeadlineExceeded",
    "Draining",
    "DynamicBatcher",
    "DynamicConfig",
    "IterationBatcher",
    "QueueFull",
    "RequestBatcher",
    "RequestError",
    "Result",
    "StaticBatcher",
    "WorkItem",
]
