"""A labelled counter child's add, without the checks ``Counter.inc`` repeats on every call.

``Counter.inc`` asks whether the child is observable (two calls), checks the amount's sign
and the exemplar, then adds under the value's lock: ~56 Python opcodes, of which the add is
~19. The engine core increments ~6 counters per batch (executions, inferences, successes,
requests per front end...): ~330 of a batch's ~6,400 opcodes (``benchmarks.core_cost``'s
trace). A child bound at start-up is observable for its life, and these amounts are counts,
never negative, so the add alone is what is left to do.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def counter_add(child: Any) -> Callable[[float], None]:
    """``child.inc`` for a labelled child (or an unlabelled counter) of
    ``prometheus_client.Counter``, as its value's own add where the library keeps one
    (``_value.inc``: the same lock, the same sample); the public ``inc`` otherwise."""
    if getattr(child, "_labelnames", ()) and not getattr(child, "_labelvalues", ()):
        raise ValueError("counter_add takes a labelled child, not the labelled parent")
    value = getattr(child, "_value", None)
    add = getattr(value, "inc", None)
    return add if callable(add) else child.inc
