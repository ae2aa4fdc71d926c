"""After a canary is aborted the model serves its full count again on the old spec (SPEC section 13:
"the stable copies keep serving on the old spec"). Where the canary replaced a copy in place, its
replica starts again on the model as it was at the rollout's from_revision, read from the catalog's
git repository; without git (or without that revision) it waits, and says why."""

from __future__ import annotations

from dataclasses import replace

import pytest

from reconciler.decide.canary import OldSpec, begin, spec_key
from reconciler.catalog import load_catalog, model_at
from reconciler.errors import CatalogInvalid
from reconciler.record.memory import old_specs
from reconciler.model import RolloutPolicy, spec_hash
from reconciler.decide.plan import plan
from reconciler.vocabulary import ActionKind, RolloutPhase, WaitKind
from tests.builders import catalog, fleet, gpus, inventory, model, node_spec, observed, profile, rank
from tests.gitcatalog import CatalogRepo
from tests.test_apply_pass import env  # noqa: F401  (a fixture)

P = profile("p", gpus_per_node=8)
OLD = replace(model("m", P, replicas=3), rollout=RolloutPolicy(canary_replicas=1, weight=10))
P_NEW = replace(P, args=("--new",))
M = replace(OLD, profiles=(P_NEW,))
F = fleet(*(node_spec(n) for n in "abc"))
OLD_HASH, NEW_HASH = spec_hash(OLD, P), spec_hash(M, P_NEW)
ABORTED = replace(begin(M, 0, "b" * 40, "a" * 40), state=RolloutPhase.ABORTED, reason="request: 2 of 2 failed: HTTP 500")


def fleet_with(m0_hash: str | None):
    """Three nodes, no spare room: m-1 and m-2 on the old spec; m-0 on `m0_hash`, or gone (None)."""
    m0 = [rank("m-0", "m", "p", gpus=range(8), spec_hash=m0_hash)] if m0_hash else []
    return inventory(observed("a", gpu=gpus(8), replicas=m0),
                     observed("b", gpu=gpus(8), replicas=[rank("m-1", "m", "p", gpus=range(8), spec_hash=OLD_HASH)]),
                     observed("c", gpu=gpus(8), replicas=[rank("m-2", "m", "p", gpus=range(8), spec_hash=OLD_HASH)]))


def test_in_place_after_an_abort_the_canary_replica_starts_again_on_the_old_spec():
    p = plan(catalog(F, M), fleet_with(None), rollouts={"m": ABORTED},
             old_specs={"m": OldSpec(OLD, "a" * 40)})
    starts = [a for a in p.actions if a.action == ActionKind.START]
    assert [(a.replica, a.placement.nodes[0].node) for a in starts] == [("m-0", "a")]
    assert starts[0].spec == OLD and starts[0].spec_revision == "a" * 40
    assert spec_hash(starts[0].spec, starts[0].spec.profile("p")) == OLD_HASH
    assert "old spec of revision aaaaaaaaaaaa" in starts[0].reason
    # Every replica is placed: the model's count is whole again, and nothing waits for the spec to change.
    assert p.unplaced == () and set(p.outcomes) == {"m-0", "m-1", "m-2"}
    assert "m-0" not in {w.replica for w in p.waiting}
    # The old copies are kept as they are, on the old spec.
    assert {w.replica: w.kind for w in p.waiting} == {"m-1": WaitKind.ROLLOUT_ABORTED, "m-2": WaitKind.ROLLOUT_ABORTED}


def test_the_old_spec_waits_for_the_canary_copy_to_be_gone_never_starting_beside_it():
    p = plan(catalog(F, M), fleet_with(NEW_HASH), rollouts={"m": ABORTED},
             old_specs={"m": OldSpec(OLD, "a" * 40)})
    assert [(a.action, a.replica) for a in p.actions] == [(ActionKind.STOP, "m-0")]


def test_the_aborted_spec_itself_is_never_started_again():
    p = plan(catalog(F, M), fleet_with(None), rollouts={"m": ABORTED}, old_specs={"m": OldSpec(OLD, "a" * 40)})
    start = next(a for a in p.actions if a.action == ActionKind.START)
    assert spec_hash(start.spec, start.spec.profile(start.placement.profile)) != NEW_HASH


def test_without_the_old_spec_the_replica_waits_and_says_why():
    why = "the catalog is not a git repository, so its old spec cannot be read"
    p = plan(catalog(F, M), fleet_with(None), rollouts={"m": ABORTED}, old_specs={"m": OldSpec(None, "a" * 40, why)})
    assert not [a for a in p.actions if a.action == ActionKind.START]
    w = next(w for w in p.waiting if w.replica == "m-0")
    assert w.kind == WaitKind.ROLLOUT_ABORTED and why in w.reason and "HTTP 500" in w.reason


# -- the old spec read from git, at the edge


def _model(args: str) -> str:
    return ("name: m\nsource: /models/m\nreplicas: 3\nprofiles:\n  - name: cpu\n    engine: command\n"
            f"    command: [/bin/true, {args}]\n    port: 9000\n"
            "rollout:\n  canary: {replicas: 1, weight: 10, analysis_s: 30}\n")


def test_model_at_reads_the_model_as_its_revision_held_it(tmp_path):
    repo = CatalogRepo(tmp_path / "cat")
    repo.write("models/m.yaml", _model("--old"))
    first = repo.commit("m, old")
    repo.write("models/m.yaml", _model("--new"))
    repo.commit("m, new")
    then = load_catalog(repo.path)
    got = model_at(repo.path, first, "m")
    assert got.profile("cpu").command == ("/bin/true", "--old")
    assert spec_key(got) != spec_key(then.model("m"))


def test_model_at_refuses_in_words_without_git_or_the_revision(tmp_path):
    repo = CatalogRepo(tmp_path / "cat")
    with pytest.raises(CatalogInvalid) as no_rev:
        model_at(repo.path, "f" * 40, "alpha")
    assert "revision ffffffffffff is not in the catalog's git repository" in str(no_rev.value)
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(CatalogInvalid) as no_git:
        model_at(plain, "f" * 40, "alpha")
    assert "not a git repository" in str(no_git.value)
    with pytest.raises(CatalogInvalid) as no_model:
        model_at(repo.path, repo.head(), "absent")
    assert "no valid model named absent" in str(no_model.value)


def test_old_specs_loads_each_aborted_model_at_its_from_revision(tmp_path):
    repo = CatalogRepo(tmp_path / "cat")
    repo.write("models/m.yaml", _model("--old"))
    first = repo.commit("m, old")
    repo.write("models/m.yaml", _model("--new"))
    head = repo.commit("m, new")
    cat = load_catalog(repo.path)
    m = cat.model("m")
    aborted = replace(begin(m, 0, head, first), state=RolloutPhase.ABORTED, reason="canary m-0 failed")
    got = old_specs(cat, {"m": aborted})
    assert got["m"].revision == first and got["m"].model.profile("cpu").command == ("/bin/true", "--old")
    # Progressing, nothing is read; an abort that does not know where it came from says so.
    assert old_specs(cat, {"m": begin(m, 0, head, first)}) == {}
    unknown = old_specs(cat, {"m": replace(aborted, from_revision=None)})["m"]
    assert unknown.model is None and "not known" in unknown.why


# -- the actor starts the old spec it is given, not the catalog's


def test_a_start_on_the_old_spec_runs_that_spec_and_keeps_its_revision(tmp_path, env):  # noqa: F811
    from reconciler.model import Action, Assignment, Placement
    from tests.apply_support.local import free_port
    from tests.apply_support.seams import catalog as local_catalog, tiny_model
    from tests.test_apply_pass import one_pass

    fleet, transports, launcher, records = env
    port = free_port()
    new, old = tiny_model("m", args=["--ready-after", "0.1"]), tiny_model("m")
    cat = replace(local_catalog(tmp_path, fleet, new), revision="b" * 40)
    where = Placement(replica="m-0", model="m", profile="p", fabric=None, pool="none/cpu",
                      nodes=(Assignment("n1", 0, (), (), port),))

    def planner(catalog, inventory, **_):
        if any(r.id == "m-0" for n in inventory.nodes for r in n.replicas):
            return []
        return [Action(ActionKind.START, "m-0", "m", "canary aborted", where, spec=old, spec_revision="a" * 40)]

    result = one_pass(cat, transports, launcher, planner, records)
    assert result.replicas["m-0"].phase == "Ready" and result.replicas["m-0"].revision == "a" * 40
    assert [r.spec_hash for r in launcher.ranks("n1")] == [spec_hash(old, old.profiles[0])]
    assert spec_hash(old, old.profiles[0]) != spec_hash(new, new.profiles[0])


# -- surge: where there is room the old copy serves on beside the canary, and an abort keeps it

F4 = fleet(*(node_spec(n) for n in "abcd"))


def surged():
    """m-0's canary copy on the spare node d, its old copy still on a; m-1, m-2 on the old spec."""
    return inventory(*[observed(n, gpu=gpus(8), replicas=[rank(f"m-{i}", "m", "p", gpus=range(8), spec_hash=OLD_HASH)])
                       for i, n in enumerate("abc")],
                     observed("d", gpu=gpus(8), replicas=[rank("m-0", "m", "p", gpus=range(8), spec_hash=NEW_HASH)]))


def test_a_canary_surge_keeps_the_old_copy_serving_once_the_new_one_is_ready():
    spare = inventory(*[observed(n, gpu=gpus(8), replicas=[rank(f"m-{i}", "m", "p", gpus=range(8), spec_hash=OLD_HASH)])
                        for i, n in enumerate("abc")], observed("d", gpu=gpus(8)))
    p = plan(catalog(F4, M), spare)
    (a,) = p.actions
    assert (a.action, a.replica, a.placement.nodes[0].node) == (ActionKind.REPLACE, "m-0", "d")
    assert not a.stop_first and a.keep_previous
    # A model without rollout: surges replace as before (the old copy goes once the new one is Ready).
    (plain,) = plan(catalog(F4, replace(M, rollout=None)), spare).actions
    assert not plain.keep_previous


def test_while_progressing_the_old_copy_beside_the_canary_is_never_stopped():
    p = plan(catalog(F4, M), surged(), rollouts={"m": begin(M, 0, "b" * 40, "a" * 40)}, placed_on={"m-0": ("d",)})
    assert p.actions == ()
    assert [x.node for x in p.beside["m-0"].nodes] == ["a"] and p.outcomes["m-0"].placement.nodes[0].node == "d"


def test_on_abort_only_the_canary_copy_is_stopped_and_the_old_copy_is_the_replica_again():
    p = plan(catalog(F4, M), surged(), rollouts={"m": ABORTED}, placed_on={"m-0": ("d",)},
             old_specs={"m": OldSpec(OLD, "a" * 40)})
    assert [(a.action, a.replica, [x.node for x in a.placement.nodes]) for a in p.actions] == [
        (ActionKind.STOP, "m-0", ["d"])]
    assert p.actions[0].drain
    # m-0 stays on a (no start, nothing unplaced): three stable copies on the old spec.
    assert {rid: o.placement.nodes[0].node for rid, o in p.outcomes.items()} == {"m-0": "a", "m-1": "b", "m-2": "c"}
    assert p.unplaced == () and {w.replica: w.kind for w in p.waiting} == {
        r: WaitKind.ROLLOUT_ABORTED for r in ("m-0", "m-1", "m-2")}
    # The next pass, the canary copy still draining: the old copy is the replica, the canary a stale copy.
    after = plan(catalog(F4, M), surged(), rollouts={"m": ABORTED}, placed_on={"m-0": ("a",)},
                 old_specs={"m": OldSpec(OLD, "a" * 40)})
    assert [(a.action, [x.node for x in a.placement.nodes]) for a in after.actions] == [(ActionKind.STOP, ["d"])]
    assert after.outcomes["m-0"].placement.nodes[0].node == "a"


def test_at_promotion_the_old_copy_beside_the_canary_is_drained_and_stopped():
    promoting = replace(begin(M, 0, "b" * 40, "a" * 40), state=RolloutPhase.PROMOTING)
    p = plan(catalog(F4, M), surged(), rollouts={"m": promoting}, placed_on={"m-0": ("d",)})
    stops = [a for a in p.actions if a.action == ActionKind.STOP]
    assert [(a.replica, [x.node for x in a.placement.nodes], a.drain) for a in stops] == [("m-0", ["a"], True)]
    assert p.beside == {}


def test_the_old_copy_beside_a_ready_canary_stays_in_the_gateway_with_the_stable_share(tmp_path, env):  # noqa: F811
    import yaml

    from reconciler.model import Action, Assignment, Placement
    from reconciler.decide.plan_values import drain_key
    from tests.apply_support.local import free_port
    from tests.apply_support.seams import catalog as local_catalog, tiny_model
    from tests.test_apply_pass import one_pass

    fleet, transports, launcher, records = env
    policy = RolloutPolicy(canary_replicas=1, weight=10)
    old = replace(tiny_model("m", replicas=1), rollout=policy)
    new = replace(tiny_model("m", replicas=1, args=["--ready-after", "0.1"]), rollout=policy)
    on = {n: Placement(replica="m-0", model="m", profile="p", fabric=None, pool="none/cpu",
                       nodes=(Assignment(n, 0, (), (), free_port()),)) for n in ("n1", "n2")}

    def start(catalog, inventory, **_):
        return [Action(ActionKind.START, "m-0", "m", "missing", on["n1"])]

    def surge(catalog, inventory, **_):
        return [Action(ActionKind.REPLACE, "m-0", "m", "spec changed", on["n2"], previous=on["n1"], drain=True,
                       keep_previous=True)]

    assert one_pass(local_catalog(tmp_path, fleet, old), transports, launcher, start, records).replicas["m-0"].phase == "Ready"
    result = one_pass(local_catalog(tmp_path, fleet, new), transports, launcher, surge, records)
    # Both copies run; the canary is the replica, the old copy a stable copy beside it.
    assert [r.alive for n in ("n1", "n2") for r in launcher.ranks(n)] == [True, True]
    assert result.replicas["m-0"].canary and result.replicas["m-0"].nodes[0].node == "n2"
    beside = result.replicas[drain_key("m-0", ["n1"])]
    assert beside.phase == "Ready" and not beside.canary and beside.nodes[0].node == "n1"
    doc = yaml.safe_load((tmp_path / "catalog" / "status" / "gateway" / "litellm.yaml").read_text())
    weights = {e["model_info"]["id"]: e["litellm_params"]["weight"] for e in doc["model_list"]}
    assert weights == {"m-0": 9, "m-0/canary": 1}  # 10% to the canary, 90% to the old copy
