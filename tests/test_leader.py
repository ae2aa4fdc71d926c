"""SPEC section 14, the pure parts: `leader:` in fleet.yaml checked where it is written, and the
election's decisions (who acts, and when a leader must stop)."""

from __future__ import annotations

import pytest

from reconciler.catalog import load_catalog
from reconciler.control.election import Candidate, judge, renew_deadline_s
from reconciler.vocabulary import Role
from tests.test_catalog import MODEL, problems_of, write_catalog

NODES = """\
nodes:
  - id: gpu-1
    address: 10.0.0.1
"""


def fleet(leader: str) -> str:
    return leader + NODES


def test_leader_section_builds_the_fleet(tmp_path):
    (tmp_path / "ca.pem").write_text("x")
    catalog = load_catalog(write_catalog(tmp_path, {
        "fleet.yaml": fleet("leader:\n  etcd:\n    endpoints: [https://e1:2379, https://e2:2379]\n"
                            "    ca_file: ca.pem\n  lease_s: 9\n"),
        "models/llama.yaml": MODEL}))
    leader = catalog.fleet.leader
    assert leader.endpoints == ("https://e1:2379", "https://e2:2379")
    assert (leader.ca_file, leader.cert_file, leader.lease_s) == ("ca.pem", None, 9)


def test_without_leader_nothing_changes(tmp_path):
    catalog = load_catalog(write_catalog(tmp_path, {"fleet.yaml": NODES, "models/llama.yaml": MODEL}))
    assert catalog.fleet.leader is None


CASES = {
    "lease_below_five_seconds": (
        "leader:\n  etcd:\n    endpoints: [http://e1:2379]\n  lease_s: 2\n",
        "fleet.yaml:4:12", "lease_s: 2 is out of range; must be at least 5"),
    "endpoint_that_is_not_a_url": (
        "leader:\n  etcd:\n    endpoints: [http://e1:2379, e2:2379]\n",
        "fleet.yaml:3:33", "etcd endpoint 'e2:2379' is not a URL"),
    "endpoint_without_a_port": (
        "leader:\n  etcd:\n    endpoints:\n      - https://e1\n",
        "fleet.yaml:4:9", "etcd endpoint 'https://e1' has no port"),
    "ca_file_that_does_not_exist": (
        "leader:\n  etcd:\n    endpoints: [https://e1:2379]\n    ca_file: /nonexistent/ca.pem\n",
        "fleet.yaml:4:14", "leader.etcd.ca_file: /nonexistent/ca.pem: no such file on this host"),
    "cert_without_key": (
        "leader:\n  etcd:\n    endpoints: [https://e1:2379]\n    cert_file: fleet.yaml\n",
        "fleet.yaml:4:16", "leader.etcd.cert_file needs key_file too"),
    "no_endpoints": (
        "leader:\n  etcd:\n    endpoints: []\n",
        "fleet.yaml:3:16", "endpoints: must not be empty"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_leader_section_is_named_where_it_is(tmp_path, name):
    text, where, words = CASES[name]
    problems = problems_of(write_catalog(tmp_path, {"fleet.yaml": fleet(text), "models/llama.yaml": MODEL}))
    assert any(p.startswith(where) and words in p for p in problems), problems


ME, OTHER = Candidate("a", 1, 0.0, 10), Candidate("b", 2, 0.0, 7)


def test_the_lowest_key_that_is_mine_leads_while_renewed():
    view = judge(now=100.0, lease_s=15, renewed_at=95.0, mine=10, leader=ME, etcd_error=None)
    assert view.role is Role.LEADER and view.epoch == 10


def test_a_leader_stops_acting_at_its_renew_deadline_before_the_lease_expires():
    deadline = renew_deadline_s(15)
    assert deadline < 15
    last = judge(now=100.0 + deadline - 0.01, lease_s=15, renewed_at=100.0, mine=10, leader=ME, etcd_error="down")
    after = judge(now=100.0 + deadline, lease_s=15, renewed_at=100.0, mine=10, leader=ME, etcd_error="down")
    assert last.role is Role.LEADER
    assert after.role is Role.NO_ETCD and not after.leading and "renew deadline" in after.why


def test_another_key_leading_makes_a_standby_that_names_it():
    view = judge(now=1.0, lease_s=15, renewed_at=1.0, mine=10, leader=OTHER, etcd_error=None)
    assert view.role is Role.STANDBY and view.leader.host == "b" and view.epoch == 7 and not view.leading


def test_etcd_unreachable_before_any_campaign_waits_as_a_standby():
    view = judge(now=1.0, lease_s=15, renewed_at=None, mine=None, leader=None, etcd_error="no etcd endpoint answered")
    assert view.role is Role.NO_ETCD and not view.leading and view.epoch == 0
