"""The election against a real etcd cluster of three members on loopback (SPEC section 14):
one leader, epochs that grow, a leader cut off from etcd that stops acting before its lease can
expire, a member restarted, etcd absent at start, certificates that cannot be read."""

from __future__ import annotations

import time

import pytest

from reconciler.control.election import Election, state_key
from reconciler.control.etcd import EtcdClient, EtcdConfigError, EtcdUnavailable
from reconciler.vocabulary import Role
from tests.etcd_cluster import EtcdCluster, cluster, free_ports, have_etcd  # noqa: F401  (cluster: a fixture)
from tests.tcp_proxy import TcpProxy

pytestmark = [pytest.mark.process,
              pytest.mark.skipif(not have_etcd(), reason="etcd-server is not installed (scripts/test.sh installs it)")]

LEASE_S = 5


class Log:
    def __init__(self):
        self.events = []

    def __call__(self, event, **fields):
        self.events.append((event, fields))

    def names(self):
        return [e for e, _ in self.events]


def election(endpoints, owner, host, log=None):
    return Election(EtcdClient(endpoints, timeout_s=1.0), owner, LEASE_S, log=log or Log(), host=host)


def wait_for(predicate, timeout_s=20.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    return predicate()


def test_one_of_two_leads_and_the_other_stands_by_naming_it(cluster, request):
    owner = request.node.name
    a, b = election(cluster.endpoints, owner, "mgmt-a"), election(cluster.endpoints, owner, "mgmt-b")
    a.start(wait_s=3)
    assert wait_for(lambda: a.view().leading)
    b.start(wait_s=3)
    try:
        view = wait_for(lambda: b.view() if b.view().role is Role.STANDBY else None)
        assert view.leader.host == "mgmt-a" and view.epoch == a.epoch()
        assert not b.view().leading and b.epoch() is None
    finally:
        a.stop()
        b.stop()


def test_a_stopped_leader_hands_over_and_the_epoch_grows(cluster, request):
    owner = request.node.name
    a, b = election(cluster.endpoints, owner, "mgmt-a"), election(cluster.endpoints, owner, "mgmt-b")
    a.start(wait_s=3)
    assert wait_for(lambda: a.view().leading)
    b.start(wait_s=3)
    first = a.epoch()
    a.stop()  # revokes its lease: b need not wait out the TTL
    try:
        assert wait_for(lambda: b.view().leading, timeout_s=10)
        assert b.epoch() > first
    finally:
        b.stop()


def test_a_leader_cut_off_from_etcd_stops_acting_before_the_other_acts(cluster, request):
    owner = request.node.name
    proxies = [TcpProxy(p) for p in cluster.client_ports]
    log_a = Log()
    a = election([p.url for p in proxies], owner, "mgmt-a", log_a)
    b = election(cluster.endpoints, owner, "mgmt-b")
    a.start(wait_s=3)
    assert wait_for(lambda: a.view().leading)
    old = a.epoch()
    b.start(wait_s=3)
    try:
        for p in proxies:
            p.cut()
        # Watch both until b leads: a must have stopped acting before b began.
        overlap = []
        deadline = time.monotonic() + 3 * LEASE_S
        while time.monotonic() < deadline:
            b_leads, a_leads = b.view().leading, a.view().leading
            if b_leads and a_leads:
                overlap.append(time.monotonic())
            if b_leads:
                break
            time.sleep(0.02)
        assert b.view().leading and not overlap
        assert a.view().role is Role.NO_ETCD and a.epoch() is None
        assert "leader.lost" in log_a.names()
        assert b.epoch() > old
        # A deposed leader's write of the pass state is refused by etcd: its key is gone.
        client = EtcdClient(cluster.endpoints)
        assert not client.put_if(state_key(owner, "memory"), b"old", guard_key=f"{a.prefix}{a._lease:x}",
                                 guard_create_revision=old)
        for p in proxies:
            p.mend()
        # Back in touch, a finds its lease expired and campaigns again, behind b.
        assert wait_for(lambda: a.view().role is Role.STANDBY, timeout_s=3 * LEASE_S)
        assert a.view().leader.host == "mgmt-b"
    finally:
        a.stop()
        b.stop()
        for p in proxies:
            p.close()


def test_a_member_restarted_leaves_the_leader_leading(cluster, request):
    owner = request.node.name
    a = election(cluster.endpoints, owner, "mgmt-a")
    a.start(wait_s=3)
    try:
        assert wait_for(lambda: a.view().leading)
        epoch = a.epoch()
        cluster.stop(0)  # the member a talks to first
        time.sleep(LEASE_S)
        assert a.view().leading and a.epoch() == epoch
        cluster.start(0)
        time.sleep(1)
        assert a.view().leading and a.epoch() == epoch
    finally:
        a.stop()


def test_etcd_unreachable_at_start_waits_as_a_standby_then_leads(tmp_path, request):
    log = Log()
    late = EtcdCluster(tmp_path / "late", size=1)
    a = election(late.endpoints, request.node.name, "mgmt-a", log)
    a.start(wait_s=3)
    try:
        assert a.view().role is Role.NO_ETCD and a.epoch() is None
        assert "leader.no-etcd" in log.names()
        assert "no etcd endpoint answered" in a.view().why
        late.start()
        assert wait_for(lambda: a.view().leading, timeout_s=15)
    finally:
        a.stop()
        late.close()


def test_certificates_that_cannot_be_read_are_named(tmp_path):
    bad = tmp_path / "ca.pem"
    bad.write_text("not a certificate\n")
    port = free_ports(1)[0]
    with pytest.raises(EtcdConfigError, match=str(bad)):
        EtcdClient([f"https://127.0.0.1:{port}"], ca_file=str(bad))
    with pytest.raises(EtcdConfigError, match="client.pem"):
        EtcdClient([f"https://127.0.0.1:{port}"], cert_file=str(tmp_path / "client.pem"),
                   key_file=str(tmp_path / "client-key.pem"))


def test_no_endpoint_answering_is_one_error_naming_each(tmp_path):
    ports = free_ports(2)
    client = EtcdClient([f"http://127.0.0.1:{p}" for p in ports], timeout_s=0.5)
    with pytest.raises(EtcdUnavailable) as info:
        client.grant(5)
    assert all(f"127.0.0.1:{p}" in str(info.value) for p in ports)


def openssl(*args, cwd):
    import subprocess

    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_ca(d, name):
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name}",
            "-keyout", f"{name}-key.pem", "-out", f"{name}.pem", cwd=d)


def signed(d, ca, name, ext):
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", f"{name}-key.pem",
            "-out", f"{name}.csr", cwd=d)
    (d / f"{name}.ext").write_text(ext)
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}-key.pem", "-CAcreateserial",
            "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.pem", cwd=d)


def test_tls_with_client_certificates_and_a_ca_that_does_not_sign_the_server_named(tmp_path):
    import subprocess

    from tests.etcd_cluster import ETCD

    d = tmp_path / "pki"
    d.mkdir()
    make_ca(d, "ca")
    make_ca(d, "other-ca")
    # clientAuth too: etcd's JSON gateway dials its own gRPC port with the server certificate.
    signed(d, "ca", "server", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n")
    signed(d, "ca", "client", "extendedKeyUsage=clientAuth\n")
    client_port, peer_port = free_ports(2)
    log = open(tmp_path / "etcd.log", "wb")
    proc = subprocess.Popen(
        [ETCD, "--name", "tls", "--data-dir", str(tmp_path / "data"),
         "--listen-client-urls", f"https://127.0.0.1:{client_port}",
         "--advertise-client-urls", f"https://127.0.0.1:{client_port}",
         "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
         "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
         "--initial-cluster", f"tls=http://127.0.0.1:{peer_port}",
         "--cert-file", str(d / "server.pem"), "--key-file", str(d / "server-key.pem"),
         "--client-cert-auth", "--trusted-ca-file", str(d / "ca.pem")],
        stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    try:
        url = f"https://127.0.0.1:{client_port}"
        good = EtcdClient([url], ca_file=str(d / "ca.pem"), cert_file=str(d / "client.pem"),
                          key_file=str(d / "client-key.pem"))
        lease = None
        deadline = time.monotonic() + 20
        while lease is None and time.monotonic() < deadline:
            try:
                lease = good.grant(5)
            except EtcdUnavailable:
                time.sleep(0.2)
        assert lease, (tmp_path / "etcd.log").read_text()[-2000:]
        wrong = EtcdClient([url], ca_file=str(d / "other-ca.pem"), cert_file=str(d / "client.pem"),
                           key_file=str(d / "client-key.pem"))
        with pytest.raises(EtcdUnavailable) as info:
            wrong.grant(5)
        assert "other-ca.pem" in str(info.value) and "TLS" in str(info.value)
    finally:
        proc.kill()
        proc.wait(10)
        log.close()
