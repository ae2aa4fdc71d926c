"""The daemon collects cyclic garbage between passes, not inside them (control/collector.py)."""

from __future__ import annotations

import gc
import io
import weakref

from reconciler.control.collector import BetweenPasses
from reconciler.control.log import EventLog
from reconciler.control.loop import Daemon, DaemonOptions
from reconciler.model import Catalog, Fleet


class Node:
    """An object in a reference cycle (it holds itself): only the cyclic collector frees it."""

    def __init__(self):
        self.me = self


def cycle() -> weakref.ref:
    return weakref.ref(Node())


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_inside_no_automatic_collection_after_it_the_setting_it_found():
    gc.enable()
    with BetweenPasses():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with BetweenPasses():
            pass
        assert not gc.isenabled()  # a caller that had it off gets it off again
    finally:
        gc.enable()



def test_a_pass_ends_with_automatic_collection_off_whoever_turned_it_on_meanwhile():
    # The dashboard's request thread restores the setting it found when its request began: one begun
    # before the daemon's collector took over turns automatic collection back on when it ends.
    gc.enable()
    with BetweenPasses() as collector:
        gc.enable()  # that request, ending
        collector.after_pass()
        assert not gc.isenabled()
    assert gc.isenabled()

def test_after_a_pass_the_young_cycles_go_and_the_old_wait_for_the_full_collection():
    clock = Clock()
    with BetweenPasses(full_every_s=600, clock=clock) as collector:
        old_node = Node()
        old = weakref.ref(old_node)
        gc.collect(1)  # it survives a young collection while still in use: now it is an old object
        del old_node
        young = cycle()
        assert young() is not None and old() is not None  # nothing collects on its own in here
        assert collector.after_pass() >= 1
        assert young() is None
        assert old() is not None  # only the whole heap's walk frees an old cycle
        clock.now = 599.0
        collector.after_pass()
        assert old() is not None
        clock.now = 600.0
        collector.after_pass()
        assert old() is None


class CyclePass:
    """A daemon's pass function that leaves a cycle behind, and looks at the one the last pass left."""

    def __init__(self):
        self.left: weakref.ref | None = None
        self.seen: list[tuple[bool, bool]] = []  # (automatic collection on, last pass's cycle still there)

    def __call__(self, catalog, log, *, trigger: str):
        self.seen.append((gc.isenabled(), self.left is not None and self.left() is not None))
        self.left = cycle()


def test_the_daemon_frees_a_pass_s_cycles_before_the_next_pass_and_never_collects_inside_one(tmp_path):
    (tmp_path / "models").mkdir()
    cat = Catalog(fleet=Fleet(nodes=()), models=(), root=str(tmp_path))
    pass_fn = CyclePass()
    gc.enable()
    d = Daemon(tmp_path, pass_fn=pass_fn, load=lambda path: cat, log=EventLog("json", stream=io.StringIO()),
               options=DaemonOptions(interval=0.01, max_passes=3, watch=False))
    assert d.serve() == 0
    assert pass_fn.seen == [(False, False), (False, False), (False, False)]
    assert gc.isenabled()
