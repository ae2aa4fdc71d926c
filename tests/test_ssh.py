"""SshTransport against real OpenSSH servers in network namespaces (tests/fleet.py)."""

from __future__ import annotations

import dataclasses
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from reconciler.errors import CommandTimeout, HostKeyError, TransportError
from reconciler.model import NodeSpec, SshSettings
from reconciler.observe.ssh import TransportPool, fingerprint, resolve_target
from reconciler.observe.transport import LocalTransport
from tests.fleet import fleet  # noqa: F401  (pytest fixture)

pytestmark = [pytest.mark.fleet]


@pytest.fixture(scope="module")
def nodes(fleet):  # noqa: F811
    fleet.add_node("alpha")
    fleet.add_node("beta")
    return fleet


@pytest.fixture
def pool():
    with TransportPool(min_backoff_s=0, max_backoff_s=0) as p:
        yield p


def spec_of(fleet, node_id: str, **ssh_overrides) -> NodeSpec:  # noqa: F811
    node = fleet.fleet_spec([node_id]).nodes[0]
    if ssh_overrides:
        node = dataclasses.replace(node, ssh=dataclasses.replace(node.ssh, **ssh_overrides))
    return node


def test_argv_is_quoted_once_so_shell_syntax_in_arguments_reaches_the_command_verbatim(nodes, pool):
    t = pool.transport_for(spec_of(nodes, "alpha"))
    marker = nodes.node("alpha").dir / "home" / "pwned"
    args = ["a b", "$(touch ~/pwned)", "'q'", '"dq"', "semi;colon", "back`tick`", "*"]
    r = t.run(["printf", "%s|", *args])
    assert r.rc == 0
    assert r.stdout.decode() == "".join(a + "|" for a in args)
    assert not marker.exists()


def test_stdin_reaches_the_command_and_exit_codes_and_stderr_come_back(nodes, pool):
    t = pool.transport_for(spec_of(nodes, "alpha"))
    blob = os.urandom(1 << 20)  # larger than one SSH window
    r = t.run(["cat"], stdin=blob)
    assert r.rc == 0 and r.stdout == blob
    r = t.run(["sh", "-c", "echo oops >&2; exit 7"])
    assert (r.rc, r.stdout, r.stderr) == (7, b"", b"oops\n")


def test_one_connection_is_reused_across_commands_and_passes(nodes, pool):
    node = spec_of(nodes, "alpha")
    first = pool.transport_for(node).run(["sh", "-c", "echo $SSH_CLIENT"]).stdout.split()
    second = pool.transport_for(node).run(["sh", "-c", "echo $SSH_CLIENT"]).stdout.split()
    assert pool.transport_for(node) is pool.transport_for(node)
    # SSH_CLIENT is "client-ip client-port server-port": the same client port is the same TCP connection.
    assert first[1] == second[1]


def test_a_broken_connection_is_reopened_on_the_next_command(nodes, pool):
    node = spec_of(nodes, "beta")
    t = pool.transport_for(node)
    before = t.run(["sh", "-c", "echo $SSH_CLIENT"]).stdout.split()[1]
    nodes.kill_sshd("beta")
    nodes.start_sshd("beta")
    r = t.run(["sh", "-c", "echo $SSH_CLIENT"])
    assert r.rc == 0 and r.stdout.split()[1] != before


def test_a_command_past_its_deadline_raises_command_timeout_naming_the_node(nodes, pool):
    t = pool.transport_for(spec_of(nodes, "alpha"))
    with pytest.raises(CommandTimeout) as err:
        t.run(["sleep", "30"], timeout=0.3)
    assert err.value.node == "alpha" and "sleep ran past 0.3s" in str(err.value)
    assert t.run(["true"]).rc == 0  # the connection survives a timed-out command


def test_unknown_host_key_is_refused_with_its_fingerprint(nodes, pool, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    node = spec_of(nodes, "alpha", known_hosts=str(empty))
    with pytest.raises(HostKeyError) as err:
        pool.transport_for(node).run(["true"])
    key_fp = subprocess.run(["ssh-keygen", "-lf", str(nodes.node("alpha").dir / "ssh_host_ed25519_key.pub")],
                            capture_output=True, text=True).stdout.split()[1]
    msg = str(err.value)
    assert msg.startswith("alpha: ") and "not in" in msg and key_fp in msg


def test_a_missing_known_hosts_file_is_refused_not_trusted(nodes, pool, tmp_path):
    node = spec_of(nodes, "alpha", known_hosts=str(tmp_path / "nope"))
    with pytest.raises(HostKeyError, match="is missing"):
        pool.transport_for(node).run(["true"])


def alpha_fingerprint(nodes) -> str:
    pub = nodes.node("alpha").dir / "ssh_host_ed25519_key.pub"
    return subprocess.run(["ssh-keygen", "-lf", str(pub)], capture_output=True, text=True, check=True).stdout.split()[1]


def test_a_known_hosts_path_that_cannot_be_read_is_refused_naming_the_node_and_the_fingerprint(nodes, pool, tmp_path):
    node = spec_of(nodes, "alpha", known_hosts=str(tmp_path))  # a directory, not a file
    with pytest.raises(HostKeyError) as err:
        pool.transport_for(node).run(["true"])
    msg = str(err.value)
    assert msg.startswith("alpha: ") and "cannot be read" in msg and alpha_fingerprint(nodes) in msg


def test_a_corrupt_known_hosts_line_is_skipped_and_the_other_lines_still_verify(nodes, pool, tmp_path):
    corrupt = f"{nodes.node('alpha').address} ssh-ed25519 !!not-base64"
    known = tmp_path / "known_hosts"
    known.write_text(corrupt + "\n" + nodes.node("alpha").host_key_line + "\n")
    assert pool.transport_for(spec_of(nodes, "alpha", known_hosts=str(known))).run(["true"]).rc == 0

    only_corrupt = tmp_path / "only_corrupt"
    only_corrupt.write_text("# a comment\n" + corrupt + "\n")
    with pytest.raises(HostKeyError) as err:
        pool.transport_for(spec_of(nodes, "alpha", known_hosts=str(only_corrupt))).run(["true"])
    msg = str(err.value)
    assert msg.startswith("alpha: ") and "line 2 of it holds no usable key" in msg and alpha_fingerprint(nodes) in msg


def test_a_key_marked_revoked_is_refused_even_where_another_line_trusts_it(nodes, pool, tmp_path):
    line = nodes.node("alpha").host_key_line  # "<address> ssh-ed25519 <blob>"
    _, kind, blob = line.split()
    known = tmp_path / "known_hosts"
    known.write_text(f"{line}\n@revoked * {kind} {blob}\n")
    with pytest.raises(HostKeyError) as err:
        pool.transport_for(spec_of(nodes, "alpha", known_hosts=str(known))).run(["true"])
    msg = str(err.value)
    assert msg.startswith("alpha: ") and "@revoked" in msg and alpha_fingerprint(nodes) in msg


def test_changed_host_key_is_refused_naming_both_fingerprints(fleet, pool):  # noqa: F811
    fleet.add_node("gamma")
    node = spec_of(fleet, "gamma")
    assert pool.transport_for(node).run(["true"]).rc == 0
    pool.forget("gamma")
    fleet.rekey("gamma")
    with pytest.raises(HostKeyError) as err:
        pool.transport_for(node).run(["true"])
    assert "HOST KEY CHANGED" in str(err.value) and str(err.value).count("SHA256:") == 2


def test_refused_authentication_names_the_user_and_key(nodes, pool, tmp_path):
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    with pytest.raises(TransportError) as err:
        pool.transport_for(spec_of(nodes, "alpha", identity_file=str(other))).run(["true"])
    assert "authentication refused for root@" in str(err.value) and str(other) in str(err.value)


RESOLVE_ONLY_HERE = """
import sys
from reconciler.errors import TransportError
from reconciler.model import NodeSpec
from reconciler.observe.ssh import TransportPool

with TransportPool() as pool:
    try:
        pool.transport_for(NodeSpec(id="dns", address=sys.argv[1], data_address=sys.argv[1])).run(["true"])
    except TransportError as exc:
        print(exc)
"""


def connect_with_loopback_resolver(tmp_path, address: str) -> subprocess.CompletedProcess:
    """Connect to `address` from a process whose /etc/resolv.conf (in a private mount namespace)
    names only 127.0.0.1, where no DNS server listens: a lookup fails without a packet leaving."""
    conf = tmp_path / "resolv.conf"
    conf.write_text("nameserver 127.0.0.1\noptions attempts:1 timeout:1\n")
    script = (f"mount --bind {shlex.quote(str(conf))} /etc/resolv.conf && "
              f"exec {shlex.quote(sys.executable)} -c {shlex.quote(RESOLVE_ONLY_HERE)} {shlex.quote(address)}")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                          capture_output=True, text=True, timeout=60, env=env)


def test_unresolvable_name_refused_port_and_timeout_each_have_their_own_message(nodes, pool, tmp_path):
    # The name is looked up against a loopback resolver, never the machine's own (tests send no traffic out).
    out = connect_with_loopback_resolver(tmp_path, "no-such-node.invalid")
    assert out.stdout.startswith("dns: cannot resolve host name 'no-such-node.invalid': "), out.stdout + out.stderr
    refused = spec_of(nodes, "alpha", port=2)
    with pytest.raises(TransportError, match=r"connection refused by 10\.213\.\d+\.\d+:2 "):
        pool.transport_for(dataclasses.replace(refused, id="refused")).run(["true"])
    nodes.cut("beta")
    try:
        with pytest.raises(TransportError, match="timed out connecting to|no route to"):
            pool.transport_for(dataclasses.replace(spec_of(nodes, "beta", connect_timeout_s=0.5), id="cut")).run(["true"])
    finally:
        nodes.restore("beta")


def test_a_host_name_with_an_over_long_label_is_a_transport_error_naming_the_node(pool):
    # Python's idna codec refuses a label over 63 characters before any lookup: no packet leaves.
    node = NodeSpec(id="long", address="n" * 64 + ".invalid", data_address="n" * 64 + ".invalid")
    with pytest.raises(TransportError) as err:
        pool.transport_for(node).run(["true"])
    assert err.value.node == "long" and "not a valid host name" in str(err.value)


def test_ssh_config_alias_and_proxy_jump_route_through_the_jump_host(nodes, tmp_path):
    alpha, beta = nodes.node("alpha"), nodes.node("beta")
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host beta-via-alpha\n  HostName {beta.address}\n  ProxyJump root@{alpha.address}\n  IdentityFile {nodes.key}\n"
    )
    node = dataclasses.replace(spec_of(nodes, "beta"), address="beta-via-alpha")
    node = dataclasses.replace(node, ssh=dataclasses.replace(node.ssh, identity_file=None))
    with TransportPool(ssh_config_path=str(config)) as pool:
        r = pool.transport_for(node).run(["sh", "-c", "echo $SSH_CLIENT $LLMFLEET_NODE"])
    client_ip, _, _, node_name = r.stdout.decode().split()
    assert node_name == "beta"
    assert client_ip == alpha.address  # beta saw the connection come from alpha: it went through the jump


def test_a_port_in_ssh_config_that_is_no_port_makes_that_node_unreachable_naming_it_not_a_traceback(tmp_path):
    config = tmp_path / "ssh_config"
    config.write_text("Host wordport\n  HostName 127.0.0.1\n  Port abc\n"
                      "Host bigjump\n  HostName 127.0.0.1\n  ProxyJump 127.0.0.1:99999\n")
    with TransportPool(ssh_config_path=str(config)) as pool:
        with pytest.raises(TransportError) as err:
            pool.transport_for(NodeSpec(id="w", address="wordport", data_address="127.0.0.1")).run(["true"])
        assert err.value.node == "w" and "Port 'abc' in ~/.ssh/config for wordport is not a TCP port" in str(err.value)
        # 99999 is not wrapped round to 34463 and dialled: nothing is dialled at all
        with pytest.raises(TransportError) as err:
            pool.transport_for(NodeSpec(id="j", address="bigjump", data_address="127.0.0.1")).run(["true"])
        assert err.value.node == "j" and "Port '99999' in ProxyJump 127.0.0.1:99999 is not a TCP port" in str(err.value)


def test_ssh_config_supplies_what_fleet_yaml_leaves_unset(tmp_path):
    config = tmp_path / "ssh_config"
    config.write_text("Host gpu1\n  HostName 10.9.9.9\n  User serve\n  Port 2222\n  IdentityFile /keys/k\n")
    import paramiko

    cfg = paramiko.SSHConfig.from_path(str(config))
    t = resolve_target("gpu1", SshSettings(), cfg)
    assert (t.hostname, t.port, t.user, t.identity_files, t.known_hosts_name) == ("10.9.9.9", 2222, "serve", ("/keys/k",), "[10.9.9.9]:2222")
    t = resolve_target("gpu1", SshSettings(user="ops", port=2200, identity_file="/keys/ops"), cfg)
    assert (t.port, t.user, t.identity_files) == (2200, "ops", ("/keys/ops",))


def test_local_nodes_get_a_local_transport(pool):
    node = NodeSpec(id="here", address="127.0.0.1", data_address="127.0.0.1", transport="local")
    t = pool.transport_for(node)
    assert isinstance(t, LocalTransport)
    assert t.run(["sh", "-c", "echo $0 ok"]).stdout == b"sh ok\n"


def test_fingerprint_matches_ssh_keygen(nodes):
    import paramiko

    pub = nodes.node("alpha").dir / "ssh_host_ed25519_key.pub"
    kind, blob = pub.read_text().split()[:2]
    key = paramiko.PKey.from_type_string(kind, __import__("base64").b64decode(blob))
    expected = subprocess.run(["ssh-keygen", "-lf", str(pub)], capture_output=True, text=True).stdout.split()[1]
    assert fingerprint(key) == expected


class CountingConnector:
    """A connector seam: fails the first `failures` opens with a refused connection, counting attempts."""

    def __init__(self, failures: int):
        import paramiko

        from reconciler.observe.ssh import _Shared

        self.shared = _Shared(None, 4)
        self.failures = failures
        self.attempts = 0
        self._paramiko = paramiko

    def open(self, node_id, target, settings):
        self.attempts += 1
        if self.attempts <= self.failures:
            raise TransportError(node_id, "connection refused by x:22 (no SSH server listening)")
        raise TransportError(node_id, "stop here")


def test_a_node_that_failed_is_not_retried_before_its_backoff_and_then_is():
    from reconciler.observe.ssh import SshTransport

    now = [100.0]
    connector = CountingConnector(failures=2)
    node = NodeSpec(id="flaky", address="10.0.0.9", data_address="10.0.0.9")
    t = SshTransport(node, connector=connector, min_backoff_s=1, max_backoff_s=8, clock=lambda: now[0])
    with pytest.raises(TransportError, match="connection refused"):
        t.run(["true"])
    with pytest.raises(TransportError, match="connection refused"):
        t.run(["true"])  # within the backoff: the last error again, without a new attempt
    assert connector.attempts == 1
    now[0] += 1.0
    with pytest.raises(TransportError, match="connection refused"):
        t.run(["true"])
    assert connector.attempts == 2
    now[0] += 1.5  # the second failure doubled the backoff to 2 s
    with pytest.raises(TransportError, match="connection refused"):
        t.run(["true"])
    assert connector.attempts == 2
    now[0] += 0.5
    with pytest.raises(TransportError, match="stop here"):
        t.run(["true"])
    assert connector.attempts == 3


class RefusingConnector(CountingConnector):
    """A connector seam whose node always offers a host key known_hosts does not trust."""

    def open(self, node_id, target, settings):
        from reconciler.errors import HostKeyError

        self.attempts += 1
        raise HostKeyError(node_id, "HOST KEY CHANGED for x")


def test_a_refused_host_key_stalls_the_node_until_known_hosts_changes_instead_of_retrying_every_pass(tmp_path):
    from reconciler.errors import HostKeyError, kind_of
    from reconciler.model import SshSettings
    from reconciler.observe.ssh import SshTransport

    known = tmp_path / "known_hosts"
    known.write_text("")
    now = [100.0]
    connector = RefusingConnector(failures=0)
    node = NodeSpec(id="rekeyed", address="10.0.0.9", data_address="10.0.0.9", ssh=SshSettings(known_hosts=str(known)))
    t = SshTransport(node, connector=connector, min_backoff_s=1, max_backoff_s=8, clock=lambda: now[0])
    with pytest.raises(HostKeyError) as caught:
        t.run(["true"])
    assert kind_of(caught.value) == "permanent"
    for _ in range(5):  # passes go by, far past any temporary backoff: no new handshake
        now[0] += 30
        with pytest.raises(HostKeyError, match="HOST KEY CHANGED"):
            t.run(["true"])
    assert connector.attempts == 1
    known.write_text("10.0.0.9 ssh-ed25519 AAAA\n")  # the operator acts
    with pytest.raises(HostKeyError):
        t.run(["true"])
    assert connector.attempts == 2


def test_temporary_failures_back_off_exponentially_with_jitter_up_to_the_cap():
    from reconciler.observe.ssh import SshTransport

    now = [0.0]
    connector = CountingConnector(failures=100)
    node = NodeSpec(id="flaky", address="10.0.0.9", data_address="10.0.0.9")
    t = SshTransport(node, connector=connector, min_backoff_s=1, max_backoff_s=8, clock=lambda: now[0], jitter=lambda: 1.0)
    attempts_at = []
    while len(attempts_at) < 6:
        before = connector.attempts
        with pytest.raises(TransportError):
            t.run(["true"])
        if connector.attempts > before:
            attempts_at.append(now[0])
        now[0] += 0.125
    waits = [b - a for a, b in zip(attempts_at, attempts_at[1:])]
    # The largest jitter shortens each wait by a quarter: 1, 2, 4, 8, 8 (the cap) less 25%.
    assert waits == [0.75, 1.5, 3.0, 6.0, 6.0]


def test_keys_held_by_ssh_agent_log_in_when_no_key_file_does(nodes, tmp_path, monkeypatch):
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL)
    try:
        env = {"SSH_AUTH_SOCK": str(sock), "PATH": os.environ["PATH"]}
        for _ in range(200):
            if sock.exists():
                break
            __import__("time").sleep(0.01)
        subprocess.run(["ssh-add", "-q", str(nodes.key)], env=env, check=True, capture_output=True)
        monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))
        node = spec_of(nodes, "alpha", identity_file=str(tmp_path / "no-such-key"))
        with TransportPool() as pool:
            assert pool.transport_for(node).run(["true"]).rc == 0
    finally:
        agent.kill()
        agent.wait()


def test_an_encrypted_key_without_an_agent_is_named_as_the_reason(nodes, tmp_path, monkeypatch):
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    locked = tmp_path / "locked"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "secret", "-f", str(locked)], check=True)
    with TransportPool() as pool:
        with pytest.raises(TransportError, match=r"no usable private key to log in as root: .*locked is encrypted"):
            pool.transport_for(spec_of(nodes, "alpha", identity_file=str(locked))).run(["true"])


def test_an_unreadable_ssh_config_is_a_usage_error_not_a_traceback(tmp_path):
    from reconciler.errors import UsageError

    bad = tmp_path / "config"
    bad.write_text("Host x\n  ProxyCommand\n")
    with pytest.raises(UsageError, match="cannot read this SSH config"):
        TransportPool(ssh_config_path=str(bad))


def test_nodes_behind_one_jump_host_share_one_connection_to_it(fleet, tmp_path):  # noqa: F811
    from concurrent.futures import ThreadPoolExecutor

    fleet.add_node("bastion")
    bastion = fleet.node("bastion").address
    for i in range(4):
        fleet.add_node(f"behind{i}")
    config = tmp_path / "ssh_config"
    config.write_text("".join(
        f"Host behind{i}\n  HostName {fleet.node(f'behind{i}').address}\n  ProxyJump root@{bastion}\n" for i in range(4)
    ))
    aliased = [dataclasses.replace(spec_of(fleet, f"behind{i}"), address=f"behind{i}") for i in range(4)]
    with TransportPool(ssh_config_path=str(config)) as pool:
        with ThreadPoolExecutor(4) as ex:
            clients = list(ex.map(lambda s: pool.transport_for(s).run(["sh", "-c", "echo $SSH_CLIENT"]).stdout.split(), aliased))
        into_bastion = fleet.exec("bastion", ["ss", "-Htn", "state", "established", "( sport = :22 )"]).stdout.splitlines()
    assert {c[0].decode() for c in clients} == {bastion}
    assert len(into_bastion) == 1, into_bastion


def test_every_connection_of_a_pool_lives_in_one_event_loop_thread_not_a_thread_each(nodes):
    import threading

    before = {t.ident for t in threading.enumerate()}
    with TransportPool() as pool:
        for name in ("alpha", "beta"):
            assert pool.transport_for(spec_of(nodes, name)).run(["true"]).rc == 0
            assert pool.transport_for(spec_of(nodes, name)).connected
        started = [t.name for t in threading.enumerate() if t.ident not in before]
    # Besides the loop: asyncio's default executor (at most min(32, CPUs + 4) threads, however
    # many nodes), where asyncssh builds each connection's options.
    assert [name for name in started if not name.startswith("asyncio_")] == ["ssh-loop"]
    assert not any(t.name == "ssh-loop" for t in threading.enumerate() if t.ident not in before)  # closed with the pool
