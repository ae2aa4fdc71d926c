"""Names and numbers the whole package agrees on, defined once.

Exit codes are the command line's contract (SPEC section 5); STATUS_DIR is where
the reconciler writes under a catalog (SPEC section 2), and the one directory the
catalog loader, the daemon's watcher and git's revision ignore as desired state.
"""

from __future__ import annotations

from enum import IntEnum


class Exit(IntEnum):
    OK = 0
    # The catalog is invalid; for `plan --fail-on-unplaced` a replica could not be placed;
    # for `apply` an action failed; for `logs`/`status` the replica or catalog asked for is not there.
    FAILED = 1
    USAGE = 2
    UNREACHABLE = 3  # no node of the fleet (or the one node asked for) answered
    INTERRUPTED = 130  # Ctrl-C
    BROKEN_PIPE = 141  # the reader of stdout left (`| head`)


STATUS_DIR = "status"  # under the catalog root, written by the reconciler only
