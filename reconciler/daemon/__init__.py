"""`reconciler run`: the daemon. Its jobs, one module each:

  loop.py       the loop: waking, signals and shutdown, one pass at a time, status written after each
  revisions.py  which revision is in force: pull, read what is committed, load it, status/catalog.yaml
  watch.py      the file watcher thread (git refs or working-tree files changed)
  lock.py       one reconciler acting on a catalog at a time, daemon or apply (flock)
  events.py     the log, text or JSON lines
  observe.py    metrics and node events from a pass result (served by metrics.MetricsServer)
"""

from reconciler.daemon.events import EventLog, event_level
from reconciler.daemon.lock import LOCK_NAME, CatalogLock, DaemonLocked
from reconciler.daemon.loop import Daemon, DaemonOptions, PassFn
from reconciler.daemon.revisions import DETACHED, DaemonState
from reconciler.daemon.watch import FILE_CHANGE, GIT_CHANGE, Watcher

__all__ = [
    "DETACHED", "FILE_CHANGE", "GIT_CHANGE", "LOCK_NAME", "CatalogLock", "Daemon", "DaemonLocked", "DaemonOptions",
    "DaemonState", "EventLog", "PassFn", "Watcher", "event_level",
]
