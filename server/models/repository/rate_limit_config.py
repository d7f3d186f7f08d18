"""An instance group's ``rate_limiter`` (Triton's), read at load as Triton reads it.

What each instance needs is ``batchers.rate_limiter.InstanceLimits``; whether it is used is
the server's ``--rate-limit`` (off: the config is kept, as Triton keeps it, and ignored).
"""

from __future__ import annotations

from wattserve.batchers.rate_limiter import InstanceLimits, Resource
from wattserve.server.models.repository import model_config_pb2 as pb


def group_limits(group: pb.ModelInstanceGroup) -> InstanceLimits | None:
    """The group's rate limiter (None when it sets none). Nothing more is refused here than
    Triton refuses: a name repeated in one group keeps its last count (Triton's map), an
    empty name or a count of 0 is a resource like any other; the limiter refuses a resource
    both global and per device, or too scarce under the flags, when it is on."""
    if not group.HasField("rate_limiter"):
        return None
    limiter = group.rate_limiter
    last = {res.name: Resource(res.name, res.count, getattr(res, "global")) for res in limiter.resources}
    return InstanceLimits(tuple(last.values()), limiter.priority)
