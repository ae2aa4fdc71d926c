"""A peer that is not an SSH server is one line naming the node, never paramiko's traceback."""

from __future__ import annotations

import socket
import threading

import yaml


def test_a_node_that_answers_but_is_not_ssh_is_one_line_not_a_traceback(cli, tmp_path):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    stop = threading.Event()

    def hang_up():  # accept and close at once: paramiko reads no banner
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
                conn.close()
            except OSError:
                pass

    thread = threading.Thread(target=hang_up, daemon=True)
    thread.start()
    try:
        root = tmp_path / "catalog"
        (root / "models").mkdir(parents=True)
        (tmp_path / "known_hosts").write_text("")
        (root / "fleet.yaml").write_text(yaml.safe_dump({
            "ssh": {"port": port, "connect_timeout_s": 5, "known_hosts": str(tmp_path / "known_hosts")},
            "nodes": [{"id": "not-ssh", "address": "127.0.0.1"}],
        }))
        r = cli("nodes", str(root))
    finally:
        stop.set()
        thread.join(timeout=5)
        server.close()
    assert r.returncode == 3, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and "Exception (client)" not in r.stderr, r.stderr
    assert "not-ssh" in r.stdout + r.stderr
