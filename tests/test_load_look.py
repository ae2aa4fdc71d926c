"""Between passes the daemon looks at the loads of what the last pass left Ready, and passes at once
when they want more replicas than that pass saw (SPEC section 11): a step of load is seen within a
second, not at the next resync. When to wake is pure (autoscale.rising, look_every); the look is the
pass function's (ApplyPass.load_rose) and the loop's (Daemon._load_rose)."""

from __future__ import annotations

import io
import json
from types import SimpleNamespace

import pytest

from reconciler.decide.autoscale import AutoscaleState, look_every, rising, rising_models
from reconciler.commands.run import ApplyPass
from reconciler.control.loop import Daemon, DaemonOptions
from reconciler.control.log import EventLog
from reconciler.act.engine_metrics import EngineLoad, LoadUnknown
from reconciler.model import (
    Assignment, AutoscalePolicy, Catalog, Fleet, Model, NodeSpec, Profile, ReplicaRange)
from reconciler.decide.outcomes import ReplicaState

POLICY = AutoscalePolicy(target=2, up_delay_s=10, down_delay_s=60)
RANGE = ReplicaRange(1, 4)
HOLDING_1 = AutoscaleState(current=1, wanted=1, since=100.0)


@pytest.mark.parametrize("state, loads, want", [
    (HOLDING_1, {"m-0": 3.0}, True),  # 3 in flight over target 2: wants 2, the last pass saw 1
    (HOLDING_1, {"m-0": 2.0}, False),  # at target: the count holds
    (HOLDING_1, {"m-0": 0.0}, False),  # a fall waits for down_delay_s and the resync: no pass for it
    (HOLDING_1, {"m-0": None}, False),  # unknown counts as at target
    (HOLDING_1, {"m-0": None, "m-1": 3.0}, True),  # 2 (unknown, at target) + 3 = 5: wants 3
    (HOLDING_1, {}, False),  # nothing Ready: no load to read
    (AutoscaleState(current=1, wanted=3, since=100.0), {"m-0": 9.0}, False),  # a rise pending: its pass is asked for
    (AutoscaleState(current=4, wanted=4, since=100.0), {"m-0": 99.0}, False),  # at max already
    (AutoscaleState(current=3, wanted=1, since=100.0), {"m-0": 7.0}, True),  # falling, now more than 3 wanted
])
def test_a_look_between_passes_wakes_the_daemon_only_for_a_rise_the_last_pass_did_not_see(state, loads, want):
    assert rising(POLICY, RANGE, state, loads) is want


def test_a_look_comes_once_a_second_or_twice_an_interval():
    assert look_every(60.0) == 1.0
    assert look_every(1.0) == 0.5


def model(name: str, *, autoscaled: bool = True) -> Model:
    return Model(name=name, source=f"/{name}", replicas=1, scale=RANGE if autoscaled else None,
                 autoscale=POLICY if autoscaled else None, spread="preferred",
                 profiles=(Profile(name="cpu", engine="llama.cpp", port=8080),))


def catalog(*models: Model) -> Catalog:
    node = NodeSpec(id="n", address="10.213.9.1", data_address="10.213.9.1")
    return Catalog(root="/nonexistent", fleet=Fleet(nodes=(node,)), models=models, revision="r")


def test_rising_models_names_only_autoscaled_models_whose_load_rose():
    cat = catalog(model("a"), model("b"), model("fixed", autoscaled=False))
    loads = {"a": ({"a-0": 5.0}, {}), "b": ({"b-0": 1.0}, {}), "fixed": ({"fixed-0": 9.0}, {})}
    assert rising_models(cat, {"a": HOLDING_1, "b": HOLDING_1}, loads) == ["a"]
    assert rising_models(cat, {}, loads) == ["a"]  # no state yet: min, as a pass starts from


class ScalingRunPass:
    """run_pass's stand-in: the pass leaves a-0 Ready and a's count where `state` says."""

    def __init__(self, state: AutoscaleState):
        self.state = state

    def __call__(self, catalog, *, transports, history, log, ready_wait_s, probe=None, autoscale=None, ready=None):
        replicas = {"a-0": ReplicaState("a-0", "a", "cpu", "Ready", nodes=(Assignment("n", 0, (), (), 8080),))}
        return SimpleNamespace(inventory=None, memory=None, replicas=replicas, autoscale={"a": self.state})


class Store:
    def load(self, root):
        return None

    def save(self, root, memory):
        pass


class Pool:
    def transport_for(self, node):
        return None

    def forget(self, node_id):
        pass

    def close(self):
        pass


def test_apply_pass_reads_the_loads_of_what_its_last_pass_left_ready_and_names_the_models_that_rose():
    asked = []
    load = {"a-0": EngineLoad(running=1, waiting=4)}

    def reader(targets):
        asked.append([(t.replica, t.address, t.port) for t in targets])
        return load

    p = ApplyPass(run_pass=ScalingRunPass(HOLDING_1), pool=Pool(), memory=(Store().load, Store().save), read_loads=reader)
    assert p.load_rose() == [] and asked == []  # no pass yet: nothing to read
    p(catalog(model("a")), lambda *a, **k: None, trigger="start")
    assert p.load_rose() == ["a"]  # 5 in flight over target 2 wants 3; the pass saw 1
    assert asked[-1] == [("a-0", "10.213.9.1", 8080)]
    load["a-0"] = EngineLoad(running=1, waiting=0)
    assert p.load_rose() == []
    load["a-0"] = LoadUnknown("timed out")
    assert p.load_rose() == []


class LookingPass:
    """A daemon's pass function with a load that rises after its first look."""

    def __init__(self, cat: Catalog):
        self.catalog, self.triggers, self.looks = cat, [], 0

    def __call__(self, catalog, log, *, trigger: str):
        self.triggers.append(trigger)
        return None

    def load_rose(self):
        self.looks += 1
        return ["a"] if self.looks >= 2 else []


def test_the_daemon_passes_when_a_look_between_passes_finds_the_load_rose_not_at_its_hourly_resync(tmp_path):
    (tmp_path / "models").mkdir()
    cat = catalog(model("a"))
    pass_fn = LookingPass(cat)
    out = io.StringIO()
    d = Daemon(tmp_path, pass_fn=pass_fn, load=lambda path: cat, log=EventLog("json", stream=out),
               options=DaemonOptions(interval=3600.0, max_passes=2, watch=False))
    assert d.serve() == 0  # --max-passes 2: returns once the second pass has run, an hour before the resync
    assert pass_fn.triggers == ["start", "wake"]
    assert pass_fn.looks == 2  # a look a second after the first pass found nothing; the next found the rise
    events = [json.loads(line) for line in out.getvalue().splitlines()]
    [rose] = [e for e in events if e["event"] == "autoscale.load-rose"]
    assert rose["models"] == ["a"]
