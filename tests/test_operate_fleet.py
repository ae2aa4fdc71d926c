"""Operating the fleet day to day on the namespaced test fleet (real sshd per node, real SSH from the CLI):
`status` from status/ alone, `logs` from the node agent's per-rank log.

Every engine carries a marker in its environment; the nodes share this machine's
pid namespace, so teardown finds and stops every process the test caused, by pid.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request

import pytest
import yaml

from tests.apply_support.cleanup import stop_every_rank
from tests.conftest import REPO
from tests.fleet import fleet  # noqa: F401  (module-scoped fixture)
from tests.gitcatalog import marked_pids, wait_for

pytestmark = [pytest.mark.fleet]

NODES = ("o1", "o2")
SECRET_NODE = "o3"  # the one node secret tests place on (node_selector), so a from_file path exists there


@pytest.fixture(scope="module")
def nodes(fleet):  # noqa: F811
    for n in NODES:
        fleet.add_node(n)
    fleet.add_node(SECRET_NODE, labels={"role": "secret"})
    return fleet


def echo_model(name: str, replicas: int, port: int, marker: str, env: dict | None = None, **extra) -> dict:
    return {
        "name": name, "source": f"{name}-weights", "replicas": replicas,
        "profiles": [{
            "name": "cpu", "engine": "command", "port": port, "start_timeout_s": 30,
            "node_selector": {"role": "secret"} if env else {},
            "command": ["python3", "-m", "reconciler.tiny_server", "--host", "0.0.0.0", "--port", "${PORT}",
                        "--model", "${MODEL_SOURCE}"],
            "env": {"E2E_MARKER": marker, "PYTHONPATH": str(REPO), **(env or {})},
            **extra,
        }],
    }


@pytest.fixture
def catalog(nodes, tmp_path, request):
    root = tmp_path / "catalog"
    (root / "models").mkdir(parents=True)
    nodes.fleet_yaml(root)
    marker = f"operate-{os.getpid()}-{request.node.name}"
    yield root, marker
    # Leave the nodes as we found them: stop every managed rank, then anything else carrying the marker.
    stop_every_rank(root)
    for pid in marked_pids(marker):
        os.kill(pid, signal.SIGKILL)


def write_model(root, doc: dict) -> None:
    (root / "models" / f"{doc['name']}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))


def private(tmp_path) -> dict:
    return {"XDG_STATE_HOME": str(tmp_path / "xdg")}


def test_status_shows_what_runs_from_status_alone_plain_when_piped_and_as_json(nodes, catalog, cli, tmp_path):
    root, marker = catalog
    write_model(root, echo_model("echo", 2, 24500, marker))
    applied = cli("apply", str(root), env=private(tmp_path))
    assert applied.returncode == 0, applied.stdout + applied.stderr

    text = cli("status", str(root))
    assert text.returncode == 0, text.stderr
    assert "\x1b" not in text.stdout  # piped: no colour codes
    lines = text.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:3] == ["MODEL", "REPLICA", "PHASE"])
    assert lines[header].split() == ["MODEL", "REPLICA", "PHASE", "NODES", "ENDPOINT", "RESTARTS", "MESSAGE"]
    rows = {line.split()[1]: line.split() for line in lines[header + 1:] if line.startswith("echo ")}
    assert sorted(rows) == ["echo-0", "echo-1"]
    assert all(r[2] == "Ready" for r in rows.values())
    on = {r[3].split(":")[0] for r in rows.values()}
    assert on == set(NODES)  # one replica per node
    for r in rows.values():
        assert r[4] == f"http://{nodes.node(r[3].split(':')[0]).address}:24500"
    assert lines[-1] == "1 model, 2 of 2 replicas Ready"

    doc = json.loads(cli("status", str(root), "--format", "json").stdout)
    on_disk = yaml.safe_load((root / "status/models/echo.yaml").read_text())
    assert doc["models"] == [{k: on_disk[k] for k in ("name", "desired", "ready", "replicas")}]
    assert set(doc) == {"revision", "models"}

    # No SSH: with every node cut off, status still answers from the files.
    for n in NODES:
        nodes.cut(n)
    try:
        again = cli("status", str(root), timeout=20)
    finally:
        for n in NODES:
            nodes.restore(n)
    assert again.stdout == text.stdout


def test_logs_prints_the_engines_own_log_tails_and_follows_it(nodes, catalog, cli, tmp_path):
    root, marker = catalog
    write_model(root, echo_model("echo", 1, 24600, marker))
    assert cli("apply", str(root), env=private(tmp_path)).returncode == 0
    status = yaml.safe_load((root / "status/models/echo.yaml").read_text())
    [head] = status["replicas"][0]["nodes"]

    logs = cli("logs", "echo-0", str(root))
    assert logs.returncode == 0, logs.stderr
    assert "serving echo-weights on 0.0.0.0:24600" in logs.stdout  # the engine's own stderr, from its node
    assert len(cli("logs", "echo-0", str(root), "--tail", "1").stdout.splitlines()) == 1

    env = dict(os.environ, PYTHONPATH=str(REPO))
    follow = subprocess.Popen([sys.executable, "-m", "reconciler", "logs", "echo-0", str(root), "--follow", "--tail", "0"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in follow.stdout], daemon=True).start()
    try:
        # Each request makes the engine write an access-log line; --follow must bring them. Requests
        # repeat until one arrives: the first may land before --follow took its starting offset.
        def a_probe_line_arrives() -> bool:
            try:
                urllib.request.urlopen(f"{head['endpoint']}/follow-probe", timeout=10).read()
            except urllib.error.HTTPError as exc:
                assert exc.code == 404  # still a line in its access log
            try:
                return "follow-probe" in lines.get(timeout=3)
            except queue.Empty:
                return False

        wait_for(a_probe_line_arrives, 60, "the engine's new log line through --follow")
    finally:
        follow.send_signal(signal.SIGINT)
        follow.wait(timeout=30)
    err = follow.stderr.read()
    assert follow.returncode == 130 and "Traceback" not in err


def test_logs_says_which_replicas_exist_which_ranks_and_when_there_is_no_log_or_no_node(nodes, catalog, cli, tmp_path):
    root, marker = catalog
    write_model(root, echo_model("fresh", 1, 24700, marker))
    # A predicted status (plan --write-status probes the fleet live) places fresh-0 on a node where nothing ran yet.
    planned = cli("plan", str(root), "--write-status")
    assert planned.returncode == 0, planned.stderr
    none_yet = cli("logs", "fresh-0", str(root))
    node = yaml.safe_load((root / "status/models/fresh.yaml").read_text())["replicas"][0]["nodes"][0]["node"]
    assert none_yet.returncode == 1
    assert none_yet.stderr.strip() == f"reconciler: fresh-0 rank 0 on {node}: no log yet (that rank has not been started there)"

    unknown = cli("logs", "fresh-9", str(root))
    assert unknown.returncode == 1 and "replicas: fresh-0" in unknown.stderr and "Traceback" not in unknown.stderr
    rank = cli("logs", "fresh-0", str(root), "--rank", "3")
    assert rank.returncode == 1 and f"its ranks: 0 on {node}" in rank.stderr

    nodes.kill_sshd(node)
    try:
        down = cli("logs", "fresh-0", str(root), timeout=60)
    finally:
        nodes.start_sshd(node)
    assert down.returncode == 3, down.stderr
    assert down.stderr.startswith(f"reconciler: fresh-0 rank 0 on {node}: node did not answer") and "Traceback" not in down.stderr


def test_status_and_logs_outside_a_catalog_say_so_in_one_line(cli, tmp_path):
    for argv in (("status", str(tmp_path)), ("logs", "echo-0", str(tmp_path))):
        r = cli(*argv)
        assert r.returncode == 1
        assert r.stderr.strip().splitlines() == [
            f"reconciler: {tmp_path} is not a catalog (no fleet.yaml, models/ or status/ in it); "
            "give the catalog directory, e.g. `reconciler status path/to/catalog`"]
    (tmp_path / "models").mkdir()
    empty = cli("status", str(tmp_path))
    assert empty.returncode == 0 and empty.stdout.startswith("no status yet under")
    assert cli("logs", "echo-0", str(tmp_path), "--tail", "-2").returncode == 2


def test_a_secret_reaches_the_engines_environment_and_nowhere_else(nodes, catalog, cli, tmp_path):
    import secrets

    root, marker = catalog
    node = nodes.node(SECRET_NODE)
    file_secret, env_secret = "file-" + secrets.token_hex(16), "env-" + secrets.token_hex(16)
    secret_file = node.dir / "secrets" / "hf_token"  # an absolute path on the node (its own directory)
    secret_file.parent.mkdir(mode=0o700, exist_ok=True)
    secret_file.write_text(file_secret + "\n")
    env = {"HF_TOKEN": {"from_file": str(secret_file)}, "GATEWAY_KEY": {"from_env": "OPS_GATEWAY_KEY"}}
    write_model(root, echo_model("keyed", 1, 24800, marker, env))
    write_model(root, echo_model("no-file", 1, 24810, marker, {"HF_TOKEN": {"from_file": "/nonexistent/hf_token"}}))
    write_model(root, echo_model("no-var", 1, 24820, marker, {"GATEWAY_KEY": {"from_env": "OPS_UNSET_VARIABLE"}}))
    run_env = dict(os.environ, PYTHONPATH=str(REPO), OPS_GATEWAY_KEY=env_secret, **private(tmp_path))
    run_env.pop("OPS_UNSET_VARIABLE", None)

    def leaks(data: bytes) -> bool:
        return file_secret.encode() in data or env_secret.encode() in data

    # The process list of this machine and of the nodes (they share its pid namespace), watched for
    # as long as apply runs: the node agent that launches the engine lives only for that moment.
    apply = subprocess.Popen([sys.executable, "-m", "reconciler", "apply", str(root)], env=run_env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    seen_in_cmdline = []
    while apply.poll() is None:
        for entry in os.listdir("/proc"):
            try:
                if entry.isdigit() and leaks(open(f"/proc/{entry}/cmdline", "rb").read()):
                    seen_in_cmdline.append(entry)
            except OSError:
                pass
    out, err = apply.communicate()
    assert not seen_in_cmdline
    assert apply.returncode == 1, out + err  # two of the three launches fail, by design
    for n in (*NODES, SECRET_NODE):  # the nodes' own view of their process list
        listing = nodes.exec(n, ["sh", "-c", "cat /proc/[0-9]*/cmdline 2>/dev/null; true"]).stdout
        assert not leaks(listing.encode())

    # The engine has both values in its environment.
    status = yaml.safe_load((root / "status/models/keyed.yaml").read_text())
    assert status["replicas"][0]["phase"] == "Ready", status
    state = node.dir / "home/.local/state/llm-reconciler"
    [record] = [json.loads(p.read_text()) for p in (state / "replicas").glob("*keyed-0.rank0.json")]
    environ = dict(e.split(b"=", 1) for e in open(f"/proc/{record['pid']}/environ", "rb").read().split(b"\0") if b"=" in e)
    assert environ[b"HF_TOKEN"] == file_secret.encode() and environ[b"GATEWAY_KEY"] == env_secret.encode()

    # A missing file or variable fails that launch, naming the reference, never a value.
    failed = {m: yaml.safe_load((root / f"status/models/{m}.yaml").read_text())["replicas"][0] for m in ("no-file", "no-var")}
    assert "{from_file: /nonexistent/hf_token}" in failed["no-file"]["message"], failed
    assert "{from_env: OPS_UNSET_VARIABLE} is not set in the reconciler's environment" in failed["no-var"]["message"], failed

    # What every command prints, and every file the reconciler left: in the catalog (status/ included),
    # in every node's state dir (records, logs), in apply's own memory.
    printed = [out, err]
    for argv in (("status", str(root)), ("status", str(root), "--format", "json"), ("logs", "keyed-0", str(root)),
                 ("plan", str(root)), ("plan", str(root), "--format", "json"), ("plan", str(root), "--format", "markdown")):
        r = subprocess.run([sys.executable, "-m", "reconciler", *argv], env=run_env, capture_output=True, timeout=120)
        printed += [r.stdout, r.stderr]
    assert not any(leaks(p) for p in printed)
    files = [p for base in [root, tmp_path / "xdg"] + [nodes.node(n).dir / "home/.local/state" for n in (*NODES, SECRET_NODE)]
             for p in base.rglob("*") if p.is_file()]
    assert any(p.name.endswith("keyed-0.rank0.json") for p in files) and any(p.name.endswith("keyed-0.rank0.log") for p in files)
    assert [str(p) for p in files if leaks(p.read_bytes())] == []
