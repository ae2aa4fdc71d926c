"""The daemon's cyclic garbage collection: between passes, never inside one.

Python's collector starts a full collection whenever the objects that survived its younger
collections reach a quarter of those it holds. A daemon watching 10,000 nodes holds some
700 MB of long-lived objects (the fleet, each node's last answer and what it was read as),
and each pass leaves enough new survivors for a full collection about once a pass: 1.1-1.9 s
of walking that heap, with every thread stopped, in the middle of a pass that otherwise takes
3 s. It finds nothing to free: what a pass leaves behind, reference counting frees.

So the daemon turns automatic collection off while it runs and collects itself, after a pass
and before it waits for the next: the young objects every time (what that pass left, a
fraction of the heap), the whole heap every FULL_EVERY_S. Cyclic garbage still goes; it only
waits, at most one pass or FULL_EVERY_S, the way idle-time collection does in other runtimes.
"""

from __future__ import annotations

import gc
import time
from typing import Callable, Self

# How often the whole heap is walked (seconds): a leak through a cycle among old objects waits
# at most this long, and a 10,000-node daemon spends about a second on it.
FULL_EVERY_S = 600.0


class BetweenPasses:
    """Within `with`: no automatic collection; after_pass() collects (young, or every FULL_EVERY_S the whole heap)."""

    def __init__(self, full_every_s: float = FULL_EVERY_S, clock: Callable[[], float] = time.monotonic):
        self._full_every_s = full_every_s
        self._clock = clock
        self._was_enabled = False
        self._last_full = 0.0

    def __enter__(self) -> Self:
        self._was_enabled = gc.isenabled()
        gc.disable()
        self._last_full = self._clock()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._was_enabled:
            gc.enable()

    def after_pass(self) -> int:
        """Collect what the last pass left in cycles; the number of objects freed. Automatic collection is
        turned off again too: a thread that saves and restores the setting around its own work (the
        dashboard's, begun before the daemon turned it off) may have turned it back on."""
        gc.disable()
        now = self._clock()
        if now - self._last_full >= self._full_every_s:
            self._last_full = now
            return gc.collect()
        return gc.collect(1)
