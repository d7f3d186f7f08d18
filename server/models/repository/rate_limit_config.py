"""An instance group's ``rate_limiter`` (Triton's), checked at load as Triton checks it.

What each instance needs is ``batchers.rate_limiter.InstanceLimits``; whether it is used is
the server's ``--rate-limit`` (off: the config is kept, as Triton keeps it, and ignored).
"""

from __future__ import annotations

from wattserve.batchers.rate_limiter import InstanceLimits, Resource
from wattserve.server.models.repository import model_config_pb2 as pb
from wattserve.server.models.repository.config import ConfigError


def group_limits(group: pb.ModelInstanceGroup, where: str) -> InstanceLimits | None:
    """The group's rate limiter (None when it sets none); a malformed one fails the load."""
    if not group.HasField("rate_limiter"):
        return None
    limiter = group.rate_limiter
    resources: list[Resource] = []
    seen: set[str] = set()
    for j, res in enumerate(limiter.resources):
        at = f"{where}.rate_limiter.resources[{j}]"
        if not res.name:
            raise ConfigError(f"{at}: resource name for rate limiter can not be empty")
        if res.name in seen:
            raise ConfigError(f"{at}: resource {res.name!r} is named twice in one instance group")
        if res.count == 0:
            raise ConfigError(f"{at}: resource {res.name!r} has count 0 (an instance needs at least 1)")
        seen.add(res.name)
        resources.append(Resource(res.name, res.count, getattr(res, "global")))
    return InstanceLimits(tuple(resources), limiter.priority)
