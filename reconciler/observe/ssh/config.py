"""Where and as whom to connect: fleet.yaml's ssh settings over ~/.ssh/config over OpenSSH's defaults.

~/.ssh/config is read by paramiko's SSHConfig parser (a file format, no network), or, where the
config uses Include or Match (which that parser ignores), resolved by the OpenSSH client itself,
`ssh -G` (OpenSshConfig). Nothing here opens a connection.
"""

from __future__ import annotations

import getpass
import os
import re
import shutil
import subprocess
import threading
from dataclasses import dataclass

import paramiko

from reconciler.model import SshSettings

DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
DEFAULT_IDENTITIES = ("~/.ssh/id_ed25519", "~/.ssh/id_ecdsa", "~/.ssh/id_rsa")


@dataclass(frozen=True)
class Target:
    """Where and as whom to connect, after ~/.ssh/config and fleet.yaml are combined."""

    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...]
    known_hosts: str
    connect_timeout_s: float
    proxy_jump: str | None = None

    @property
    def known_hosts_name(self) -> str:
        # OpenSSH writes non-default ports as [host]:port in known_hosts.
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"

    @property
    def label(self) -> str:
        return f"{self.user}@{self.hostname}:{self.port}"


def resolve_target(address: str, settings: SshSettings, config: paramiko.SSHConfig | None) -> Target:
    """fleet.yaml settings over ~/.ssh/config over OpenSSH defaults.

    fleet.yaml's port is taken as unset when it is the default 22, since the
    catalog cannot tell "22" from "not given" once defaults are applied.
    """
    found = config.lookup(address) if config is not None else {}
    hostname = found.get("hostname", address)
    port = settings.port if settings.port != 22 else tcp_port(found.get("port", 22), f"~/.ssh/config for {address}")
    user = settings.user or found.get("user") or getpass.getuser()
    if settings.identity_file:
        identities: tuple[str, ...] = (settings.identity_file,)
    elif found.get("identityfile"):
        identities = tuple(found["identityfile"])
    else:
        identities = DEFAULT_IDENTITIES
    jump = found.get("proxyjump")
    if jump and jump.strip().lower() == "none":
        jump = None
    return Target(
        hostname=hostname,
        port=port,
        user=user,
        identity_files=tuple(os.path.expanduser(p) for p in identities),
        known_hosts=os.path.expanduser(settings.known_hosts or DEFAULT_KNOWN_HOSTS),
        connect_timeout_s=float(settings.connect_timeout_s),
        proxy_jump=jump,
    )


def tcp_port(value, where: str) -> int:
    """A port number from text a user wrote; ValueError naming it when it is not one (socket would wrap 99999 to 34463)."""
    try:
        port = int(value)
    except (TypeError, ValueError):
        port = 0
    if not 0 < port < 65536:
        raise ValueError(f"Port {value!r} in {where} is not a TCP port (1-65535)")
    return port


def parse_jump(spec: str) -> tuple[str | None, str, int | None]:
    """One ProxyJump hop, `[user@]host[:port]` -> (user, host, port)."""
    user = None
    if "@" in spec:
        user, spec = spec.rsplit("@", 1)
    port = None
    if spec.startswith("["):  # [v6addr]:port
        host, _, rest = spec[1:].partition("]")
        if rest.startswith(":"):
            port = tcp_port(rest[1:], f"ProxyJump {spec}")
    elif spec.count(":") == 1:
        host, _, p = spec.partition(":")
        port = tcp_port(p, f"ProxyJump {spec}")
    else:
        host = spec
    return user, host, port


# Directives paramiko's SSHConfig does not understand: it skips `Include` (a host defined in an
# included file is dialled on port 22 as the local user) and evaluates `Match` differently.
_OPENSSH_ONLY = re.compile(r"^\s*(include|match)\b", re.IGNORECASE | re.MULTILINE)
SSH_G_TIMEOUT_S = 10.0


class OpenSshConfig:
    """An SSH config as OpenSSH itself resolves it: `ssh -G HOST` prints what `ssh HOST` would use.

    Offers paramiko SSHConfig's `lookup` (hostname, port, user, identityfile, proxyjump), with a
    key present only where the config sets it: `ssh -G` prints every default too, so its answer
    for a host is compared with its answer under an empty config (identity files, user).
    """

    def __init__(self, path: str | None, ssh: str = "ssh", timeout: float = SSH_G_TIMEOUT_S):
        self.path = path  # None: the config ssh reads by itself (~/.ssh/config and the system one)
        self.ssh = ssh
        self.timeout = timeout
        self._cache: dict[str, dict] = {}
        self._lock = threading.Lock()
        self._defaults = self._ask("reconciler-defaults.invalid", config=os.devnull)

    def _ask(self, host: str, config: str | None) -> dict[str, list[str]]:
        if host.startswith("-"):  # an argv element ssh would read as an option
            raise ValueError(f"host {host!r} starts with '-'")
        argv = [self.ssh, "-G"] + (["-F", config] if config else []) + [host]
        try:
            done = subprocess.run(argv, capture_output=True, timeout=self.timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise ValueError(f"`ssh -G {host}` did not answer within {self.timeout:g}s") from None
        except OSError as exc:
            raise ValueError(f"cannot run {self.ssh}: {exc.strerror}") from None
        if done.returncode != 0:
            why = (done.stderr.decode(errors="replace").strip().splitlines() or ["(no message)"])[-1]
            raise ValueError(f"{self.path or '~/.ssh/config'}: ssh -G {host}: {why}")
        out: dict[str, list[str]] = {}
        for line in done.stdout.decode(errors="replace").splitlines():
            key, _, value = line.partition(" ")
            out.setdefault(key.lower(), []).append(value.strip())
        return out

    def lookup(self, host: str) -> dict:
        with self._lock:
            cached = self._cache.get(host)
        if cached is not None:
            return cached
        seen = self._ask(host, self.path)
        found: dict = {"hostname": seen.get("hostname", [host])[0], "port": seen.get("port", ["22"])[0]}
        if seen.get("user") != self._defaults.get("user"):
            found["user"] = seen["user"][0]
        if seen.get("identityfile") and seen.get("identityfile") != self._defaults.get("identityfile"):
            found["identityfile"] = seen["identityfile"]
        if seen.get("proxyjump"):
            found["proxyjump"] = seen["proxyjump"][0]
        with self._lock:
            self._cache[host] = found
        return found


def load_ssh_config(path: str, *, ssh: str | None = None) -> "paramiko.SSHConfig | OpenSshConfig | None":
    """The SSH config at `path`: resolved by OpenSSH's own `ssh -G` where the config needs what
    paramiko ignores (Include, Match) and the client is installed, else parsed by paramiko."""
    if not os.path.isfile(path):
        return None
    ssh = ssh or shutil.which("ssh")
    with open(path, encoding="utf-8", errors="replace") as f:
        needs_openssh = _OPENSSH_ONLY.search(f.read()) is not None
    if needs_openssh and ssh:
        return OpenSshConfig(path, ssh=ssh)
    try:
        return paramiko.SSHConfig.from_path(path)
    except paramiko.SSHException as exc:  # a line the parser cannot read: said as a ValueError, like ssh -G's
        raise ValueError(str(exc)) from None
