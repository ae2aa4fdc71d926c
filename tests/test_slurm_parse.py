"""Slurm's text outputs, parsed (recorded from slurm 22.05.8 on the test cluster, and from a GPU cluster's shapes)."""

from __future__ import annotations

from pathlib import Path

from reconciler.model import RankLaunch, SlurmSettings
from reconciler.observe.slurm import (
    batch_script,
    expand_hostlist,
    gpu_gres,
    job_comment,
    job_name,
    parse_comment,
    parse_sbatch,
    parse_show_jobs,
    parse_show_nodes,
    parse_squeue,
    replica_of_job,
    sbatch_argv,
    slurm_error,
)

DATA = Path(__file__).parent / "data" / "slurm"


def launch(node: str, rank: int, **kw) -> RankLaunch:
    base = dict(replica="llama-0", model="llama", profile="h100", node=node, rank=rank, nnodes=2,
                argv=("vllm", "serve", "/m; rm -rf /"), env={"HF_TOKEN": "s3cret"}, port=8000 + rank, gpus=(0, 1),
                spec_hash="3f2a9c", health_path="/health" if rank == 0 else None)
    base.update(kw)
    return RankLaunch(**base)


def test_node_states_reasons_and_gpus_in_use():
    nodes = parse_show_nodes((DATA / "show_node_d.txt").read_text())
    a1, a2, b = nodes["a1"], nodes["a2"], nodes["gpu-b01"]
    assert a1.cordoned and not a1.unreachable
    assert a1.reason == "maint x=y [root@2026-12-01T11:20:40]"  # a value with spaces and `=` stays whole
    assert (a1.gpus_used, a1.gpus_used_idx) == (1, None)  # 22.05 with File= devices: a count, no IDX
    assert a2.unreachable and not a2.cordoned  # IDLE*: not responding
    assert b.unreachable and b.reason.startswith("Not responding")
    assert (b.gpus_used, b.gpus_used_idx) == (3, (0, 1, 5))


def test_job_details_give_gpu_indices_per_node_through_host_ranges():
    jobs = parse_show_jobs((DATA / "show_job_d.txt").read_text())
    assert jobs["1"].gpus == {"a1": (0,), "a2": (0,)}
    assert jobs["7"].user == "alice"
    assert jobs["7"].gpus == {"gpu-b01": (0, 1, 5), "gpu-b02": (6, 7)}
    assert jobs["8"].state == "PENDING" and jobs["8"].gpus == {}


def test_a_job_s_batch_host_is_where_its_output_is_written():
    jobs = parse_show_jobs((DATA / "show_job_d.txt").read_text())
    assert jobs["1"].batch_host == "a1"
    assert jobs["8"].batch_host == ""  # pending: no node yet


def test_hostlists_and_gres():
    assert expand_hostlist("a[1-3,5],login1") == ["a1", "a2", "a3", "a5", "login1"]
    assert expand_hostlist("gpu-b[01-02]") == ["gpu-b01", "gpu-b02"]
    assert expand_hostlist("n[1-2]-ib[3-4]") == ["n1-ib3", "n1-ib4", "n2-ib3", "n2-ib4"]
    assert expand_hostlist("(null)") == []
    assert gpu_gres("gpu:h100:1(IDX:3),mps:0") == (1, (3,))
    assert gpu_gres("gpu:0") == (0, None)


def test_a_range_too_wide_to_be_a_cluster_is_kept_as_text_not_expanded():
    # Expanded as written, each would build billions of names or indices (a controller's bad answer).
    assert expand_hostlist("n[1-4000000000],x1") == ["n[1-4000000000]", "x1"]
    assert expand_hostlist("n[1-60000]-ib[1-60000]") == ["n[1-60000]-ib[1-60000]"]
    assert gpu_gres("gpu:2(IDX:0,5-4294967295)") == (2, (0,))


def test_squeue_lines_keep_names_and_comments_whole():
    out = "1\x1fllmrc.x.m-0\x1fRUNNING\x1fNone\x1f2026-12-01T11:20:38\x1fllmrc/1 abc m p a1:8000:0\n" \
          "2\x1fmy | odd job\x1fPENDING\x1fResources\x1fN/A\x1f\n"
    jobs = parse_squeue(out)
    assert [(j.job_id, j.name, j.state, j.reason, j.live, j.pending) for j in jobs] == [
        ("1", "llmrc.x.m-0", "RUNNING", "None", True, False), ("2", "my | odd job", "PENDING", "Resources", True, True)]


def test_job_name_and_comment_round_trip_in_rank_order():
    launches = [launch("b", 1, gpus=(2, 3)), launch("a", 0)]
    assert job_name("team", "llama-0") == "llmrc.team.llama-0"
    assert replica_of_job("team", "llmrc.team.llama-0") == "llama-0"
    assert replica_of_job("other", "llmrc.team.llama-0") is None
    shape = parse_comment(job_comment(launches))
    assert shape.ranks == (("a", 8000), ("b", 8001)) and shape.gpus == ((0, 1), (2, 3))
    assert (shape.spec_hash, shape.model, shape.profile, shape.nnodes) == ("3f2a9c", "llama", "h100", 2)
    assert parse_comment("someone's own comment") is None


def test_sbatch_argv_carries_every_setting_as_one_element_each_and_no_secret():
    settings = SlurmSettings(submit_via="login1", partition="gpu", account="inference", qos="high",
                             time_limit="2-00:00:00", extra_args=("--constraint=h100 & ib",))
    argv = sbatch_argv(settings, "team", [launch("a", 0), launch("b", 1)], {"a": "gpu-a", "b": "gpu-b"})
    assert argv[:2] == ["sbatch", "--parsable"]
    for want in ("--job-name=llmrc.team.llama-0", "--nodes=2", "--ntasks-per-node=1", "--nodelist=gpu-a,gpu-b",
                 "--gres=gpu:2", "--partition=gpu", "--account=inference", "--qos=high", "--time=2-00:00:00",
                 "--constraint=h100 & ib"):
        assert want in argv
    assert not any("s3cret" in a for a in argv)
    script = batch_script([launch("a", 0), launch("b", 1)], {"a": "gpu-a", "b": "gpu-b"}).decode()
    assert "s3cret" not in script and "rm -rf" not in script  # argv and env travel base64-encoded
    assert "<<'LLMRC_STEP_EOF'" in script and "srun" in script


def test_sbatch_answers_and_errors():
    assert parse_sbatch("42\n") == "42"
    assert parse_sbatch("42;cluster-a\n") == "42"
    assert parse_sbatch("") is None
    err = "sbatch: error: invalid partition specified: bogus\nsbatch: error: Batch job submission failed: Invalid partition name specified\n"
    assert slurm_error(err, 1) == ("sbatch: error: invalid partition specified: bogus; "
                                   "sbatch: error: Batch job submission failed: Invalid partition name specified")
