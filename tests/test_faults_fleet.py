"""Holding up under faults (issue 13, SPEC section 7 Node loss), on the namespaced fleet.

A cut link, a killed sshd, a silent node (accepts TCP, never sends the SSH banner)
and hostile nodes (a python3 that prints tens of MB, deeply nested JSON, or never
answers): each is reported with its own reason, the others are probed, a node
going and coming back is logged once each way, and what was left running on a
node past its deadline is ended there when the node answers again.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time

import pytest

from reconciler.errors import CommandTimeout
from reconciler.model import Fleet
from reconciler.observe.probe import FleetProber, probe_fleet_report
from reconciler.observe.ssh import TransportPool
from tests.fleet import fleet  # noqa: F401

pytestmark = [pytest.mark.fleet]

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


def test_plan_and_dry_run_predict_what_apply_does_with_a_cut_node_through_its_grace_period(fleet, tmp_path, cli):  # noqa: F811
    import yaml

    from reconciler.catalog import load_catalog
    from reconciler.act.launcher import SshLauncher
    from reconciler.owner import catalog_owner

    fleet.add_node("g1", gpus=["H100"], engines=["vllm"])
    fleet.add_node("g2", gpus=["H100"], engines=["vllm"])
    root = tmp_path / "catalog"
    (root / "models").mkdir(parents=True)
    doc = fleet.fleet_document(["g1", "g2"])
    doc["ssh"]["command_timeout_s"] = 2
    doc["unreachable_grace_s"] = 600
    (root / "fleet.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    records = tmp_path / "engines"
    records.mkdir()
    model = {"name": "llm", "source": "org/llm", "profiles": [{
        "name": "h100", "engine": "vllm", "gpu_class": "H100-80GB", "port": 8100, "start_timeout_s": 30,
        "env": {"FAKE_ENGINE_RECORD_DIR": str(records)}}]}
    (root / "models" / "llm.yaml").write_text(yaml.safe_dump(model, sort_keys=False))
    env = {"XDG_STATE_HOME": str(tmp_path / "xdg-state")}

    def actions(out: str) -> list[tuple[str, str]]:
        """(replica, action) of each decision or plan row, `would ` dropped, health checks left out."""
        rows = []
        for line in out.splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[1] == "llm-0":  # plan's rows: ACTION REPLICA ...
                rows.append(("llm-0", parts[0]))
            elif len(parts) >= 3 and parts[0] == "llm-0":  # apply's decisions: REPLICA NODE ACTION ...
                action = parts[1] if parts[1] in ("start", "replace", "stop", "restart") else parts[2]
                if action != "health":
                    rows.append(("llm-0", action))
        return rows

    try:
        first = cli("apply", str(root), env=env)
        assert first.returncode == 0, first.stdout + first.stderr
        where = next(line.split()[1] for line in first.stdout.splitlines() if line.startswith("llm-0") and " start " in line)
        other = {"g1": "g2", "g2": "g1"}[where]
        fleet.cut(where)

        held = cli("apply", str(root), env=env)  # the node goes: its replica is left alone, and said so
        assert f"node {where}: unreachable" in held.stdout and "llm-0" in held.stdout and "waiting" in held.stdout
        assert "nothing to do" not in held.stdout and actions(held.stdout) == [("llm-0", "waiting")]
        planned = cli("plan", str(root), env=env)
        dry = cli("apply", str(root), "--dry-run", env=env)
        applied = cli("apply", str(root), env=env)
        for out in (planned.stdout, dry.stdout, applied.stdout):
            assert f"llm-0: node {where} unreachable since " in out or f"node {where} unreachable since " in out, out
            assert "replaced elsewhere after" in out and "(grace 600 s)" in out
        assert actions(dry.stdout) == actions(applied.stdout) == [("llm-0", "waiting")]
        assert "start" not in planned.stdout.split("waiting:")[0]

        # The grace period passes: the node went unreachable 700 s ago, as the memory apply keeps says.
        memory_file = next((tmp_path / "xdg-state" / "llm-reconciler" / "apply-memory").glob("*.json"))
        state = json.loads(memory_file.read_text())
        state["unreachable_since"][where] -= 700
        memory_file.write_text(json.dumps(state))
        planned = cli("plan", str(root), env=env)
        dry = cli("apply", str(root), "--dry-run", env=env)
        applied = cli("apply", str(root), env=env)
        assert [r for r in actions(planned.stdout) if r[1] != "waiting"] == [("llm-0", "replace")], planned.stdout
        assert actions(dry.stdout)[0] == ("llm-0", "replace"), dry.stdout
        started = [line for line in applied.stdout.splitlines() if line.startswith(f"llm-0  {other}  start ")]
        assert started and "replace" in started[0] and f"node {where} unreachable for " in started[0], applied.stdout
    finally:
        fleet.restore(where) if "where" in dir() else None
        cat = load_catalog(root, with_revision=False)
        with TransportPool() as pool:
            launcher = SshLauncher.for_fleet(cat.fleet, {n.id: pool.transport_for(n) for n in cat.fleet.nodes},
                                             stop_grace_s=2, owner=catalog_owner(cat))
            for node in ("g1", "g2"):
                for rank in _ranks_once_back(launcher, node):
                    launcher.stop(node, rank.replica)


def _ranks_once_back(launcher, node, within_s: float = 15.0):
    """The node's ranks, asked again while a link just restored comes back (a cleanup, not a check)."""
    from reconciler.errors import TransportError

    deadline = time.monotonic() + within_s
    while True:
        try:
            return launcher.ranks(node)
        except TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
