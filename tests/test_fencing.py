"""Fencing on the node (SPEC section 14): the node agent keeps the highest epoch it has seen for an
owner and refuses a start or a stop of a lower one, before it touches anything. The agent's
operations are called in this process (they are plain functions over a state directory)."""

from __future__ import annotations

import json
import os

import pytest

from reconciler.agent_keys import Answer
from reconciler.act.launcher import node_agent
from reconciler.act.launcher.ssh_launcher import SshLauncher

OWNER = "cafe00000001"


def request(tmp_path, op, epoch=None, owner=OWNER, **more):
    req = {"op": op, "state_dir": str(tmp_path), "owner": owner, **more}
    if epoch is not None:
        req["epoch"] = epoch
    return req


def call(req):
    return node_agent.OPS[req["op"]](req)


def start_request(tmp_path, epoch):
    return request(tmp_path, "start", epoch, replica="llama-0", model="llama", profile="p", rank=0, spec_hash="h",
                   argv=["/nonexistent/engine"], env={}, port=1, gpus=[])


def test_a_node_keeps_the_highest_epoch_and_refuses_a_lower_one(tmp_path):
    assert call(request(tmp_path, "fence", 5)) == {Answer.OK: True}
    refused = call(request(tmp_path, "fence", 3))
    assert refused[Answer.OK] is False and refused[Answer.FENCED] == 5
    assert "epoch 5" in refused[Answer.REASON] and "epoch 3" in refused[Answer.REASON]
    assert call(request(tmp_path, "fence", 5))[Answer.OK] is True  # the same leader again
    assert call(request(tmp_path, "fence", 9))[Answer.OK] is True
    assert call(request(tmp_path, "fence", 5))[Answer.FENCED] == 9


def test_a_start_of_an_old_epoch_is_refused_before_anything_is_launched(tmp_path):
    call(request(tmp_path, "fence", 7))
    answer = call(start_request(tmp_path, 6))
    assert answer[Answer.OK] is False and answer[Answer.FENCED] == 7
    records = os.listdir(tmp_path / "replicas")
    assert not [n for n in records if n.endswith(".json")]
    assert not (tmp_path / "logs").exists()  # not even its log was opened


def test_a_stop_of_an_old_epoch_leaves_the_record(tmp_path):
    records = tmp_path / "replicas"
    records.mkdir()
    record = records / f"{OWNER}.llama-0.rank0.json"
    record.write_text(json.dumps({"id": "llama-0", "rank": 0, "pid": None, "owner": OWNER,
                                  "managed_by": "llm-reconciler"}))
    call(request(tmp_path, "fence", 4))
    answer = call(request(tmp_path, "stop", 3, replica="llama-0", rank=None))
    assert answer[Answer.FENCED] == 4 and record.exists()
    assert call(request(tmp_path, "stop", 4, replica="llama-0", rank=None))[Answer.OK] is True
    assert not record.exists()


def test_without_an_epoch_nothing_is_fenced(tmp_path):
    call(request(tmp_path, "fence", 4))
    assert call(request(tmp_path, "stop", None, replica="llama-0", rank=None))[Answer.OK] is True
    assert call(request(tmp_path, "fence", None))[Answer.OK] is True
    assert call(request(tmp_path, "fence", 3))[Answer.FENCED] == 4  # and the epoch seen is kept


def test_each_owner_has_its_own_epoch(tmp_path):
    call(request(tmp_path, "fence", 40, owner="aaaa"))
    assert call(request(tmp_path, "fence", 2, owner="bbbb"))[Answer.OK] is True


class AgentInProcess:
    """A Transport that runs the agent's request in this process: what ssh_launcher sends, answered."""

    command_timeout_s = 10

    def __init__(self):
        self.requests = []

    def run(self, argv, *, stdin=None, timeout=None):
        from reconciler.act.launcher.ssh_launcher import request_of
        from reconciler.observe.transport import CommandResult

        req = request_of(stdin)
        self.requests.append(req)
        return CommandResult(0, (json.dumps(call(req)) + "\n").encode(), b"")


def test_the_launcher_carries_its_epoch_and_reports_a_refusal_as_fenced(tmp_path):
    transport = AgentInProcess()
    new = SshLauncher({"n1": transport}, {"n1": str(tmp_path)}, owner=OWNER, epoch=12)
    old = SshLauncher({"n1": transport}, {"n1": str(tmp_path)}, owner=OWNER, epoch=11)
    assert new.fence("n1") is None
    outcome = old.stop("n1", "llama-0")
    assert outcome.fenced and not outcome.ok and "epoch 12" in outcome.detail
    assert transport.requests[-1]["epoch"] == 11
    assert old.fence("n1").fenced


def test_a_launcher_whose_lease_ran_out_sends_nothing(tmp_path):
    transport = AgentInProcess()
    launcher = SshLauncher({"n1": transport}, {"n1": str(tmp_path)}, owner=OWNER, epoch=3,
                           may_act=lambda: "the lease could not be renewed")
    outcome = launcher.stop("n1", "llama-0")
    assert outcome.fenced and not outcome.ok and "lease" in outcome.detail
    assert transport.requests == []


class QueueOnly:
    """A Slurm client whose queue is empty and that must not run anything else (no sbatch)."""

    def __init__(self):
        self.ran = []

    def queue(self):
        return []

    def run(self, argv, **kw):
        self.ran.append(argv)
        raise AssertionError(f"{argv[0]} ran for a leader that was fenced")


def test_a_fenced_slurm_launcher_submits_no_job():
    from reconciler.act.launcher.slurm_launcher import SlurmLauncher
    from reconciler.model import Assignment
    from tests.test_render import FLEET, profile, render

    prof = profile("command", gpu_class=None, gpus_per_node=0, port=9000, command=("/bin/engine",))
    [launch] = render(prof, Assignment(node="a1", rank=0, gpus=(), port=9000))
    client = QueueOnly()
    launcher = SlurmLauncher(FLEET, client, "owner", fence=lambda: "fenced: this node has seen epoch 9")
    outcome = launcher.start(launch)
    assert outcome.fenced and not outcome.ok and "epoch 9" in outcome.reason
    assert client.ran == []


@pytest.mark.process  # the agent runs as python3 processes
def test_a_pass_of_a_deposed_leader_is_fenced_on_the_node_and_says_so(tmp_path):
    """The whole way: run_pass -> the actor -> the real node agent (LocalTransport, a python3 per call):
    the node has seen epoch 5, a pass with epoch 4 starts nothing and its decision is `fenced`."""
    import yaml

    from reconciler.catalog import load_catalog
    from reconciler.owner import catalog_owner
    from reconciler.control.reconcile import run_pass
    from reconciler.observe.transport import LocalTransport
    from tests.apply_support.local import free_port
    from tests.conftest import REPO, copy_tracked

    root = tmp_path / "catalog"
    copy_tracked(REPO / "examples" / "single-machine", root)
    fleet = yaml.safe_load((root / "fleet.yaml").read_text())
    fleet["state_dir"] = str(tmp_path / "state")
    (root / "fleet.yaml").write_text(yaml.safe_dump(fleet, sort_keys=False))
    model_file = next((root / "models").glob("*.yaml"))
    model = yaml.safe_load(model_file.read_text())
    model["profiles"][0]["port"] = free_port()
    model_file.write_text(yaml.safe_dump(model, sort_keys=False))
    catalog = load_catalog(root, with_revision=False)
    transports = {"local": LocalTransport("local")}
    newer = SshLauncher.for_fleet(catalog.fleet, transports, owner=catalog_owner(catalog), epoch=5)
    assert newer.fence("local") is None
    result = run_pass(catalog, transports=transports, ready_wait_s=0, epoch=4, write_status=False)
    fenced = [d for d in result.decisions if d.action == "fenced"]
    assert fenced and not fenced[0].ok and "epoch 5" in fenced[0].reason
    assert not [p for p in (tmp_path / "state" / "replicas").glob("*.json")]  # nothing was started
