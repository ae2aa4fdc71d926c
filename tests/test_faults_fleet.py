"""Holding up under faults (issue 13, SPEC section 7 Node loss), on the namespaced fleet.

A cut link, a killed sshd, a silent node (accepts TCP, never sends the SSH banner)
and hostile nodes (a python3 that prints tens of MB, deeply nested JSON, or never
answers): each is reported with its own reason, the others are probed, a node
going and coming back is logged once each way, and what was left running on a
node past its deadline is ended there when the node answers again.
"""

from __future__ import annotations

import dataclasses
import sys
import time

import pytest

from reconciler.errors import CommandTimeout
from reconciler.model import Fleet
from reconciler.probe import FleetProber, probe_fleet_report
from reconciler.ssh import TransportPool
from tests.fleet import fleet  # noqa: F401

COMMAND_TIMEOUT_S = 3.0


def quick(spec: Fleet) -> Fleet:
    """The fleet with a short ssh.command_timeout_s, so deadlines pass within the test."""
    nodes = tuple(dataclasses.replace(n, ssh=dataclasses.replace(n.ssh, command_timeout_s=COMMAND_TIMEOUT_S)) for n in spec.nodes)
    return Fleet(nodes=nodes, ssh=nodes[0].ssh if nodes else spec.ssh)


def processes(fleet, node_id: str, pattern: str) -> list[str]:  # noqa: F811
    # Only this node's network namespace: other fleets on the machine run the same programs.
    mine = ["sh", "-c", f'exec pgrep --ns "$$" --nslist net -f {pattern}']
    return fleet.exec(node_id, mine, check=False).stdout.split()


def go_silent(fleet, node_id: str):  # noqa: F811
    """sshd gone, and in its place a listener that accepts connections and never says a word."""
    fleet.kill_sshd(node_id)
    address = fleet.node(node_id).address
    code = (
        "import socket,time\n"
        "s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        f"s.bind(({address!r}, 22)); s.listen(16); held=[]\n"
        "while True: held.append(s.accept()[0])\n"
    )
    listener = fleet.spawn(node_id, [sys.executable, "-c", code])
    deadline = time.monotonic() + 10
    while fleet.exec(node_id, ["sh", "-c", "grep -c ':0016 ' /proc/net/tcp || true"]).stdout.strip() == "0":
        assert listener.poll() is None and time.monotonic() < deadline, "silent listener did not start"
        time.sleep(0.05)
    return listener


class Log:
    def __init__(self):
        self.events: list[tuple[str, dict]] = []

    def __call__(self, event, **fields):
        self.events.append((event, fields))

    def count(self, event: str, node: str) -> int:
        return sum(1 for e, f in self.events if e == event and f.get("node") == node)


def test_cut_silent_and_dead_nodes_each_have_their_reason_are_logged_once_each_way_and_leave_nothing_running(fleet):  # noqa: F811
    for node_id in ("ok-a", "ok-b", "cut", "silent", "dead"):
        fleet.add_node(node_id)
    spec = quick(fleet.fleet_spec())
    log = Log()
    prober = FleetProber()
    with TransportPool() as pool:
        first = prober(spec, pool, log=log)
        assert [r.node.state for r in first.results] == ["ready"] * 5  # connections and probe sessions open

        fleet.cut("cut")
        fleet.kill_sshd("dead")
        listener = go_silent(fleet, "silent")
        for _ in range(3):
            result = prober(spec, pool, log=log)
            by_id = {r.node.id: r.node for r in result.results}
            assert by_id["ok-a"].state == by_id["ok-b"].state == "ready"
            assert {by_id[n].state for n in ("cut", "silent", "dead")} == {"unreachable"}
            assert {by_id[n].failure for n in ("cut", "silent", "dead")} == {"temporary"}
        for node_id in ("cut", "silent", "dead"):
            assert log.count("node.unreachable", node_id) == 1, log.events
            assert log.count("node.back", node_id) == 0
        assert log.count("node.unreachable", "ok-a") == 0

        fleet.restore("cut")
        fleet.start_sshd("dead")
        listener.kill()
        listener.wait()
        fleet.start_sshd("silent")
        deadline = time.monotonic() + 60
        while True:
            result = prober(spec, pool, log=log)
            if all(r.node.state == "ready" for r in result.results) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert [r.node.state for r in result.results] == ["ready"] * 5, [r.node.reason for r in result.results]
        for node_id in ("cut", "silent", "dead"):
            assert log.count("node.unreachable", node_id) == 1 and log.count("node.back", node_id) == 1, log.events

        # The probe session left on the cut node when its answer never came was ended there
        # once the node answered again: one session (the new one), not two.
        deadline = time.monotonic() + 20
        while len(processes(fleet, "cut", "llm-reconciler-probe")) > 1 and time.monotonic() < deadline:
            prober(spec, pool, log=log)
            time.sleep(0.2)
        assert len(processes(fleet, "cut", "llm-reconciler-probe")) == 1


def test_a_command_abandoned_at_its_deadline_is_ended_on_the_node_by_the_next_one(fleet):  # noqa: F811
    fleet.add_node("slow")
    (node,) = quick(fleet.fleet_spec(["slow"])).nodes
    with TransportPool() as pool:
        t = pool.transport_for(node)
        with pytest.raises(CommandTimeout):
            t.run(["sleep", "417"], timeout=1)
        assert processes(fleet, "slow", "'^sleep 417$'"), "closing the channel does not end a command that reads nothing"
        assert t.run(["true"]).rc == 0
        assert processes(fleet, "slow", "'^sleep 417$'") == []
        assert not t.abandoned


def test_sending_input_to_a_node_that_does_not_read_it_is_bounded_by_the_command_deadline(fleet):  # noqa: F811
    fleet.add_node("deaf")
    (node,) = quick(fleet.fleet_spec(["deaf"])).nodes
    with TransportPool() as pool:
        t = pool.transport_for(node)
        with pytest.raises(CommandTimeout) as caught:
            t.run(["sleep", "418"], stdin=b"x" * (64 << 20), timeout=2)
        assert "input" in caught.value.reason
        assert t.run(["true"]).rc == 0
        assert processes(fleet, "deaf", "'^sleep 418$'") == []


HOSTILE = {
    # Tens of MB and no end of line: read up to the cap, then refused.
    "junk": "#!/bin/sh\nexec head -c 50000000 /dev/zero | tr '\\0' x\n",
    # Valid-looking JSON nested past any parser's stack.
    "nested": "#!/bin/sh\ncat >/dev/null & exec awk 'BEGIN{for(i=0;i<200000;i++) printf \"[\"; print \"\"}'\n",
    # Takes the connection and never answers.
    "mute": "#!/bin/sh\nexec sleep 300\n",
}


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_a_hostile_python3_on_the_nodes_path_makes_it_unreachable_with_a_reason_not_a_traceback(fleet, kind):  # noqa: F811
    fleet.add_node(f"ok-{kind}")
    fleet.add_node(kind, executables={"python3": HOSTILE[kind]})
    spec = quick(fleet.fleet_spec([f"ok-{kind}", kind]))
    with TransportPool() as pool:
        result = probe_fleet_report(spec, pool)
    ok, bad = result.results
    assert ok.node.state == "ready"
    assert bad.node.state == "unreachable" and bad.node.gpus == ()
    expected = {"junk": "more than 4 MiB", "nested": "not a JSON report", "mute": f"ran past {COMMAND_TIMEOUT_S:g}s"}[kind]
    assert expected in bad.node.reason, bad.node.reason
    assert len(bad.node.reason) < 400


def test_a_refused_host_key_is_a_permanent_failure_and_a_timeout_a_temporary_one(fleet):  # noqa: F811
    fleet.add_node("rekeyed-p")
    fleet.add_node("mute-p", executables={"python3": HOSTILE["mute"]})
    fleet.rekey("rekeyed-p")  # last: adding a node rewrites known_hosts with every current key
    with TransportPool() as pool:
        rekeyed, mute = probe_fleet_report(quick(fleet.fleet_spec(["rekeyed-p", "mute-p"])), pool).results
    assert rekeyed.node.state == "unreachable" and rekeyed.node.failure == "permanent"
    assert "HOST KEY CHANGED" in rekeyed.node.reason
    assert mute.node.state == "unreachable" and mute.node.failure == "temporary"


def test_a_hung_or_garbled_nvidia_smi_on_the_nodes_path_makes_it_unusable_within_the_deadline(fleet):  # noqa: F811
    fleet.add_node("smi-hangs", gpus=["H100"], executables={"nvidia-smi": "#!/bin/sh\nexec sleep 300\n"})
    fleet.add_node("smi-junk", gpus=["H100"], executables={"nvidia-smi": "#!/bin/sh\nhead -c 3000000 /dev/urandom\n"})
    with TransportPool() as pool:
        hangs, junk = probe_fleet_report(quick(fleet.fleet_spec(["smi-hangs", "smi-junk"])), pool).results
    for r in (hangs, junk):
        assert r.node.state == "unusable" and r.node.failure == "permanent" and r.node.gpus == ()
        assert r.node.reason.startswith("GPUs unknown: ") and len(r.node.reason) < 400
        assert r.node.memory_total_mb  # the rest of the report was read
    assert "ran past" in hangs.node.reason
