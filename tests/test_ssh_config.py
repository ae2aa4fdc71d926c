"""~/.ssh/config resolved the way OpenSSH resolves it, checked against OpenSSH's own `ssh -G`.

paramiko's SSHConfig skips `Include` (the common `Include ~/.ssh/config.d/*` layout: a host
defined there was dialled on port 22 as the local user) and `Match`. Each case here writes a
real config and asks the real client what it would use.
"""

from __future__ import annotations

import getpass
import shutil
import subprocess

import paramiko
import pytest

from reconciler.model import SshSettings
from reconciler.observe.ssh import OpenSshConfig, load_ssh_config, resolve_target

pytestmark = [pytest.mark.process,
              pytest.mark.skipif(shutil.which("ssh") is None, reason="needs the OpenSSH client (scripts/test.sh installs it)")]

MAIN = """\
Include {d}/config.d/*
Host !bastion* *.corp
    User corpuser
Match host db-*
    Port 2201
Host web-*
    HostName %h.internal.example
    IdentityFile {d}/keys/web
Host deep
    HostName 10.9.9.9
    ProxyJump hop1,admin@hop2:2222
Host *
    ServerAliveInterval 30
"""
INCLUDED = """\
Host gpu-1
    HostName 10.9.0.1
    Port 2222
    User serve
"""
HOSTS = ["gpu-1", "a.corp", "bastion1.corp", "db-7", "web-3", "deep", "plain"]


@pytest.fixture
def config(tmp_path):
    (tmp_path / "config.d").mkdir()
    (tmp_path / "config.d" / "nodes").write_text(INCLUDED)
    path = tmp_path / "config"
    path.write_text(MAIN.format(d=tmp_path))
    return path


def ssh_g(path, host: str) -> dict[str, list[str]]:
    out = subprocess.run(["ssh", "-G", "-F", str(path), host], capture_output=True, text=True, timeout=30, check=True)
    seen: dict[str, list[str]] = {}
    for line in out.stdout.splitlines():
        key, _, value = line.partition(" ")
        seen.setdefault(key, []).append(value)
    return seen


@pytest.mark.parametrize("host", HOSTS)
def test_the_target_is_what_ssh_G_says(config, host):
    target = resolve_target(host, SshSettings(), load_ssh_config(str(config)))
    truth = ssh_g(config, host)
    assert (target.hostname, target.port, target.user) == (truth["hostname"][0], int(truth["port"][0]), truth["user"][0])
    assert target.proxy_jump == (truth["proxyjump"][0] if "proxyjump" in truth else None)


def test_each_feature_paramiko_misses_resolves_as_openssh_does(config, tmp_path):
    cfg = load_ssh_config(str(config))
    assert isinstance(cfg, OpenSshConfig)
    me = getpass.getuser()
    found = {h: resolve_target(h, SshSettings(), cfg) for h in HOSTS}
    assert (found["gpu-1"].hostname, found["gpu-1"].port, found["gpu-1"].user) == ("10.9.0.1", 2222, "serve")  # Include
    assert found["a.corp"].user == "corpuser" and found["bastion1.corp"].user == me  # a negated pattern
    assert found["db-7"].port == 2201  # Match host
    assert found["web-3"].hostname == "web-3.internal.example"  # %h
    assert found["web-3"].identity_files == (str(tmp_path / "keys" / "web"),)
    assert found["deep"].proxy_jump == "hop1,admin@hop2:2222"  # a ProxyJump chain
    assert (found["plain"].hostname, found["plain"].port, found["plain"].user) == ("plain", 22, me)
    # What paramiko alone makes of the same file: the included host on port 22 as the local user.
    assert paramiko.SSHConfig.from_path(str(config)).lookup("gpu-1").get("port") is None


def test_fleet_yaml_still_wins_over_the_config(config):
    target = resolve_target("gpu-1", SshSettings(user="ops", port=2200, identity_file="/k/id"), load_ssh_config(str(config)))
    assert (target.port, target.user, target.identity_files) == (2200, "ops", ("/k/id",))


def test_a_config_without_include_or_match_is_parsed_by_paramiko_as_before(tmp_path):
    path = tmp_path / "config"
    path.write_text("Host a\n    Port 2022\n")
    cfg = load_ssh_config(str(path))
    assert isinstance(cfg, paramiko.SSHConfig) and resolve_target("a", SshSettings(), cfg).port == 2022


def test_a_config_ssh_refuses_is_one_line_naming_it(tmp_path):
    path = tmp_path / "config"
    path.write_text("Include /nonexistent-dir/*\nHost a\n    NoSuchOption yes\n")
    with pytest.raises(ValueError, match=r"config: ssh -G .*(Bad configuration option|bad configuration options)"):
        OpenSshConfig(str(path)).lookup("a")
