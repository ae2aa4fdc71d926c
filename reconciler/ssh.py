"""SSH to nodes: the only module that imports paramiko.

One persistent connection per node, kept by a TransportPool across passes
(the daemon probes and applies over the same connections every pass), reopened
with backoff when it breaks. Host keys are verified against the configured
known_hosts file and nothing else: an unknown or changed key is refused with a
message naming the node and the key's SHA256 fingerprint, the way OpenSSH
prints it, so an operator can compare it with `ssh-keygen -lf`. There is no
auto-add: a reconciler that trusts the first key it sees hands every GPU in the
fleet to whoever answers first.

The user's ~/.ssh/config is honoured for HostName, User, Port, IdentityFile and
ProxyJump; what fleet.yaml sets explicitly wins over it (fleet.yaml is the
reviewed, versioned intent), what it leaves unset comes from the config. A
config that uses Include or Match (which paramiko ignores) is resolved by the
OpenSSH client itself, `ssh -G`, where it is installed (OpenSshConfig).

Foreign exceptions (paramiko, socket) are translated here, once, into
TransportError / HostKeyError / CommandTimeout naming the node, each cause with
its own message: a refused host key, refused authentication, a name that does
not resolve, a timeout, a refused connection, an unreachable network.
"""

from __future__ import annotations

import base64
import dataclasses
import errno
import getpass
import hashlib
import logging
import os
import random
import re
import select
import shlex
import shutil
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import paramiko

from reconciler.errors import CommandTimeout, HostKeyError, OutputTooLarge, TransportError, UsageError
from reconciler.model import NodeSpec, SshSettings
from reconciler.transport import CommandResult, LocalTransport, StreamClosed, Transport

# paramiko logs the failure of its transport thread (a peer that is not an SSH server, a
# banner that never comes) with a traceback at ERROR, and with no logging set up Python prints
# that on stderr. The failure reaches the caller as a TransportError naming the node instead.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
DEFAULT_IDENTITIES = ("~/.ssh/id_ed25519", "~/.ssh/id_ecdsa", "~/.ssh/id_rsa")
_READ_CHUNK = 1 << 16
# A node refused for a permanent reason (its host key) is not reconnected to on every pass; it is
# tried again when known_hosts changes, or after this long (an operator may fix the node itself).
PERMANENT_RECHECK_S = 300.0


def fingerprint(key: paramiko.PKey) -> str:
    """`SHA256:<base64, unpadded>`, as `ssh-keygen -lf` and OpenSSH's own messages print it."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


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


@dataclass(frozen=True)
class KnownHosts:
    """A known_hosts file as read: its keys, or why it could not be read, and the lines skipped."""

    keys: paramiko.HostKeys | None
    problem: str | None = None  # "is missing", or "cannot be read (...)": nothing can be verified
    skipped: tuple[int, ...] = ()  # line numbers that hold no usable key
    revoked: tuple[paramiko.PKey, ...] = ()  # `@revoked` lines: never accepted, for any host


def load_known_hosts(path: str) -> KnownHosts:
    """Read a known_hosts file line by line, as OpenSSH does: an unreadable line is skipped.

    paramiko.HostKeys(path) raises on the first line whose key is not valid
    base64, which would make one stray line a traceback (or every node
    unreachable); a skipped line only trusts less, never more.
    """
    keys = paramiko.HostKeys()
    skipped = []
    revoked = []
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        return KnownHosts(None, f"cannot be read ({exc.strerror or exc})")
    for lineno, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        marker = None
        if line.startswith("@"):  # paramiko does not read markers: `@revoked` must still refuse its key
            marker, _, line = line.partition(" ")
            line = line.strip()
        try:
            entry = paramiko.hostkeys.HostKeyEntry.from_line(line, lineno)
        except Exception:  # noqa: BLE001  paramiko raises InvalidHostKey, SSHException, ValueError... per bad line
            entry = None
        if entry is None:
            skipped.append(lineno)
            continue
        if marker == "@revoked":
            revoked.append(entry.key)
        elif marker is None:
            for name in entry.hostnames:
                keys.add(name, entry.key.get_name(), entry.key)
        # @cert-authority: host certificates are not supported; such a line trusts nothing here.
    return KnownHosts(keys, None, tuple(skipped), tuple(revoked))


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
    return paramiko.SSHConfig.from_path(path)


class _Shared:
    """What every connection of one pool shares: parsed config, known_hosts files, loaded keys, handshake slots."""

    def __init__(self, ssh_config_path: str | None, max_handshakes: int):
        path = os.path.expanduser(ssh_config_path or "~/.ssh/config")
        try:
            self.config = load_ssh_config(path)
        except (paramiko.SSHException, OSError, ValueError) as exc:
            raise UsageError(f"{path}: cannot read this SSH config: {exc}") from None
        self.handshakes = threading.BoundedSemaphore(max_handshakes)
        self._lock = threading.Lock()
        self._host_keys: dict[str, tuple[float, KnownHosts]] = {}
        self._keys: dict[str, paramiko.PKey | Exception] = {}

    def host_keys(self, path: str) -> KnownHosts:
        try:
            mtime = os.stat(path).st_mtime
        except FileNotFoundError:
            return KnownHosts(None, "is missing")
        except OSError as exc:
            return KnownHosts(None, f"cannot be read ({exc.strerror or exc})")
        with self._lock:
            cached = self._host_keys.get(path)
            if cached and cached[0] == mtime:
                return cached[1]
        known = load_known_hosts(path)
        with self._lock:
            self._host_keys[path] = (mtime, known)
        return known

    def key_problem(self, path: str) -> str | None:
        """Why the key file at `path` could not be used, once private_key() has tried it."""
        exc = self._keys.get(path)
        if isinstance(exc, FileNotFoundError):
            return None  # a default identity that simply is not there: not worth a word
        if isinstance(exc, paramiko.PasswordRequiredException) or "password" in str(exc).lower():
            return f"{path} is encrypted (load it into ssh-agent)"
        if isinstance(exc, Exception):
            return f"{path} is unreadable ({exc})"
        return None

    def private_key(self, path: str) -> paramiko.PKey | None:
        with self._lock:
            if path in self._keys:
                cached = self._keys[path]
                return None if isinstance(cached, Exception) else cached
        try:
            key: paramiko.PKey | Exception = paramiko.PKey.from_path(path)
        except FileNotFoundError as exc:
            key = exc
        except (paramiko.SSHException, OSError, ValueError, TypeError) as exc:
            # cryptography says "password-protected" with a TypeError
            key = exc
        with self._lock:
            self._keys[path] = key
        return None if isinstance(key, Exception) else key


class _HostKeyCheck:
    """Verifies a server's key against known_hosts after key exchange; raises HostKeyError."""

    def __init__(self, node_id: str, target: Target, shared: _Shared):
        self.node_id = node_id
        self.target = target
        self.file = shared.host_keys(target.known_hosts)
        self.known = self.file.keys

    def known_types(self) -> list[str]:
        entry = self.known.lookup(self.target.known_hosts_name) if self.known is not None else None
        return list(entry.keys()) if entry else []

    def verify(self, key: paramiko.PKey) -> None:
        name = self.target.known_hosts_name
        if self.known is None:
            raise HostKeyError(
                self.node_id,
                f"known_hosts file {self.target.known_hosts} {self.file.problem}, so the host key of {name} "
                f"({key.get_name()} {fingerprint(key)}) cannot be verified; refusing to connect",
            )
        if any(key == r for r in self.file.revoked):
            raise HostKeyError(
                self.node_id,
                f"host key of {name} ({key.get_name()} {fingerprint(key)}) is marked @revoked in "
                f"{self.target.known_hosts}; refusing to connect",
            )
        entry = self.known.lookup(name)
        if not entry:
            skipped = ""
            if self.file.skipped:
                n = len(self.file.skipped)
                lines = ", ".join(str(i) for i in self.file.skipped[:10]) + (", ..." if n > 10 else "")
                skipped = f"; {'lines' if n > 1 else 'line'} {lines} of it {'hold' if n > 1 else 'holds'} no usable key, skipped"
            raise HostKeyError(
                self.node_id,
                f"host key of {name} is not in {self.target.known_hosts} ({key.get_name()} {fingerprint(key)}{skipped}); "
                f"refusing to connect to an unknown host: verify the key, then add it to known_hosts",
            )
        expected = entry.get(key.get_name())
        if expected is None or expected != key:
            known = ", ".join(f"{k.get_name()} {fingerprint(k)}" for k in entry.values())
            raise HostKeyError(
                self.node_id,
                f"HOST KEY CHANGED for {name}: it offered {key.get_name()} {fingerprint(key)}, "
                f"{self.target.known_hosts} has {known}; refusing to connect (someone may be intercepting, "
                f"or the host was reinstalled: verify, then update known_hosts)",
            )


def _socket_error(node_id: str, target: Target, exc: OSError) -> TransportError:
    where = f"{target.hostname}:{target.port}"
    if isinstance(exc, socket.gaierror):
        return TransportError(node_id, f"cannot resolve host name {target.hostname!r}: {exc.strerror}")
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return TransportError(node_id, f"timed out connecting to {where} after {target.connect_timeout_s:g}s")
    if isinstance(exc, ConnectionRefusedError):
        return TransportError(node_id, f"connection refused by {where} (no SSH server listening)")
    if exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN):
        return TransportError(node_id, f"no route to {where} ({exc.strerror})")
    return TransportError(node_id, f"cannot connect to {where}: {exc.strerror or exc}")


class _Connector:
    """Opens authenticated paramiko transports for one pool, hopping through ProxyJump hosts."""

    def __init__(self, shared: _Shared):
        self.shared = shared
        self._jumps: dict[tuple, paramiko.Transport] = {}
        self._jump_locks: dict[tuple, threading.Lock] = {}
        self._jump_lock = threading.Lock()

    def open(self, node_id: str, target: Target, settings: SshSettings) -> paramiko.Transport:
        sock: socket.socket | paramiko.Channel
        if target.proxy_jump:
            sock = self._through_jumps(node_id, target, settings)
        else:
            sock = self._tcp(node_id, target)
        return self._handshake(node_id, target, sock)

    def _tcp(self, node_id: str, target: Target) -> socket.socket:
        try:
            sock = socket.create_connection((target.hostname, target.port), timeout=target.connect_timeout_s)
        except OSError as exc:
            raise _socket_error(node_id, target, exc) from None
        except UnicodeError as exc:  # the idna codec refuses it (an empty or over-long label) before any lookup
            raise TransportError(node_id, f"cannot resolve host name {target.hostname!r}: not a valid host name ({exc})") from None
        # paramiko leaves Nagle on: every small request then waits for the previous ACK (~40 ms each).
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def _through_jumps(self, node_id: str, target: Target, settings: SshSettings) -> paramiko.Channel:
        via: paramiko.Transport | None = None
        hops = [h.strip() for h in target.proxy_jump.split(",") if h.strip()]
        for hop in hops:
            try:
                user, host, port = parse_jump(hop)
                hop_settings = SshSettings(
                    user=user, port=port or 22, identity_file=None,
                    known_hosts=settings.known_hosts, connect_timeout_s=settings.connect_timeout_s,
                )
                hop_target = resolve_target(host, hop_settings, self.shared.config)
            except ValueError as exc:
                raise TransportError(node_id, f"jump host {hop}: {exc}") from None
            found = self.shared.config.lookup(host) if self.shared.config is not None else {}
            # A jump host with no IdentityFile of its own is logged into with the node's key:
            # fleets usually have one key for the bastion and the nodes behind it.
            identities = hop_target.identity_files if "identityfile" in found else target.identity_files
            hop_target = dataclasses.replace(hop_target, proxy_jump=None, identity_files=identities)
            via = self._jump(node_id, hop_target, via)
        assert via is not None
        try:
            return via.open_channel(
                "direct-tcpip", (target.hostname, target.port), ("127.0.0.1", 0), timeout=target.connect_timeout_s
            )
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise TransportError(
                node_id, f"jump host could not open a channel to {target.hostname}:{target.port}: {exc}"
            ) from None

    def _jump(self, node_id: str, hop: Target, via: paramiko.Transport | None) -> paramiko.Transport:
        key = (hop.hostname, hop.port, hop.user, id(via) if via else None)
        with self._jump_lock:
            hop_lock = self._jump_locks.setdefault(key, threading.Lock())
        # One connection per jump host, however many nodes behind it connect at once.
        with hop_lock:
            t = self._jumps.get(key)
            if t is not None and t.is_active():
                return t
            t = self._open_jump(node_id, hop, via)
            self._jumps[key] = t
            return t

    def _open_jump(self, node_id: str, hop: Target, via: paramiko.Transport | None) -> paramiko.Transport:
        if via is None:
            sock = self._tcp(node_id, hop)
        else:
            try:
                sock = via.open_channel("direct-tcpip", (hop.hostname, hop.port), ("127.0.0.1", 0), timeout=hop.connect_timeout_s)
            except (paramiko.SSHException, EOFError, OSError) as exc:
                raise TransportError(node_id, f"jump host could not reach {hop.label}: {exc}") from None
        try:
            return self._handshake(node_id, hop, sock)
        except TransportError as exc:
            raise type(exc)(node_id, f"via jump host {hop.label}: {exc.reason}") from None

    def close(self) -> None:
        with self._jump_lock:
            jumps = list(self._jumps.values())
            self._jumps.clear()
        for t in jumps:
            t.close()

    def _handshake(self, node_id: str, target: Target, sock) -> paramiko.Transport:
        check = _HostKeyCheck(node_id, target, self.shared)
        with self.shared.handshakes:
            t = _Transport(sock)
            t.banner_timeout = target.connect_timeout_s
            t.handshake_timeout = target.connect_timeout_s
            t.auth_timeout = target.connect_timeout_s
            known_types = check.known_types()
            if known_types:
                # Ask for a key type known_hosts holds, as OpenSSH does, so a host with
                # several keys is not reported "changed" for offering another type.
                opts = t.get_security_options()
                preferred = [k for k in opts.key_types if k in known_types or _base_type(k) in known_types]
                if preferred:
                    opts.key_types = preferred
            try:
                t.start_client(timeout=target.connect_timeout_s)
                check.verify(t.get_remote_server_key())
                self._authenticate(node_id, target, t)
            except TransportError:
                t.close()
                raise
            except (paramiko.SSHException, EOFError, OSError) as exc:
                t.close()
                if isinstance(exc, (socket.timeout, TimeoutError)) or "timeout" in str(exc).lower():
                    raise TransportError(node_id, f"SSH handshake with {target.hostname}:{target.port} timed out after {target.connect_timeout_s:g}s") from None
                raise TransportError(node_id, f"SSH handshake with {target.hostname}:{target.port} failed: {exc or type(exc).__name__}") from None
        t.set_keepalive(30)
        return t

    def _authenticate(self, node_id: str, target: Target, t: paramiko.Transport) -> None:
        tried = []
        for path in target.identity_files:
            key = self.shared.private_key(path)
            if key is None:
                continue
            tried.append(path)
            try:
                t.auth_publickey(target.user, key)
            except paramiko.AuthenticationException:
                continue
            if t.is_authenticated():
                return
        if os.environ.get("SSH_AUTH_SOCK"):
            # Keys held by ssh-agent, after the configured files, as OpenSSH tries them.
            try:
                agent_keys = paramiko.Agent().get_keys()
            except paramiko.SSHException:
                agent_keys = ()
            for key in agent_keys:
                tried.append(f"agent key {fingerprint(key)}")
                try:
                    t.auth_publickey(target.user, key)
                except paramiko.AuthenticationException:
                    continue
                if t.is_authenticated():
                    return
        if not tried:
            problems = [p for p in (self.shared.key_problem(f) for f in target.identity_files) if p]
            detail = "; ".join(problems) if problems else f"none of {', '.join(target.identity_files)} exists"
            raise TransportError(node_id, f"no usable private key to log in as {target.user}: {detail}")
        raise TransportError(
            node_id, f"authentication refused for {target.user}@{target.hostname} with key {', '.join(tried)}"
        )


class _Transport(paramiko.Transport):
    """paramiko's Transport, whose thread wakes every 2 s instead of every 0.1 s when idle.

    paramiko keeps one thread per connection, blocked in recv() with this timeout only to look
    whether it should stop (close() shuts the socket, which ends the wait anyway) and to send
    keepalives. At 4,000 nodes the default meant 40,000 wake-ups a second, each taking the GIL:
    the daemon spent its idle time handing the GIL around, an idle pass took 9 s and closing
    the connections at exit over 4 minutes. Handshake and auth deadlines are checked at the
    same wake-ups, so they are now kept to within 2 s rather than 0.1 s.
    """

    _active_check_timeout = 2.0


def _wait_readable(chan: paramiko.Channel, timeout: float) -> None:
    """Until the channel has something to read (or end of file), at most `timeout` seconds.

    poll, not select: a daemon with a thousand nodes holds descriptors above FD_SETSIZE
    (1024; each waited-on channel has a pipe pair besides the socket), and select() refuses
    those ("filedescriptor out of range"), which made every node past the 330th unreachable.
    """
    poller = select.poll()
    poller.register(chan, select.POLLIN)
    poller.poll(max(0, int(timeout * 1000)))


def _base_type(key_type: str) -> str:
    # rsa-sha2-256/512 are signatures over an ssh-rsa key.
    return "ssh-rsa" if key_type.startswith("rsa-sha2-") else key_type


# Every command runs under this POSIX sh prologue (shell builtins only: a node's login PATH
# may hold nothing else): it prints "<pid> <start time>" (the
# kernel's start time of the process, field 22 of /proc/<pid>/stat) on its first line of
# stdout, then execs the command, which keeps that pid. A command abandoned at its deadline
# (a cut link, a silent node) is then ended on the node when the node answers again, and
# only if that pid still is the process we started (pids are reused).
_PROLOGUE = (
    'p=$$; s=; read -r s 2>/dev/null </proc/$p/stat; s=${s##*") "}; '
    't=$(set -- $s; echo "${20}"); echo "$p ${t:-?}"; exec "$@"'
)
# Ends each "<pid> <start time>" given, where that process still has that start time.
_REAP = (
    'for e; do p=${e%% *}; t=${e#* }; s=; read -r s 2>/dev/null </proc/$p/stat || continue; '
    's=${s##*") "}; [ "$(set -- $s; echo "${20}")" = "$t" ] && kill -TERM "$p"; done; exit 0'
)
# The most a node may print for one command (or one stream answer): a probe report of a
# large node is tens of KiB; what is read from a node never grows without bound.
MAX_OUTPUT_BYTES = 4 << 20
_STDERR_KEPT = 64 << 10


def wrapped(argv: Sequence[str]) -> str:
    """The remote command line for argv: the prologue, then argv quoted once."""
    return shlex.join(["/bin/sh", "-c", _PROLOGUE, "llm-reconciler", *argv])


def _split_header(out: bytes) -> tuple[str | None, bytes]:
    """("<pid> <start>", rest) when out starts with the prologue's line, else (None, out)."""
    head, sep, rest = out.partition(b"\n")
    parts = head.split(b" ")
    if sep and len(parts) == 2 and parts[0].isdigit() and (parts[1].isdigit() or parts[1] == b"?"):
        return head.decode(), rest
    return None, out


class _Stream:
    """transport.Stream over one SSH channel: a command that answers a line per request line."""

    def __init__(
        self, node_id: str, chan: paramiko.Channel, clock: Callable[[], float],
        abandon: Callable[[str], None] = lambda process: None,
    ):
        self.node_id = node_id
        self._chan = chan
        self._clock = clock
        self._buf = bytearray()  # grown in place: bytes += would copy the whole buffer per chunk
        self._scanned = 0  # bytes of _buf known to hold no newline
        self._stderr = b""
        self._lock = threading.Lock()
        self._process: str | None = None  # "<pid> <start time>" once the prologue's line arrived
        self._header_read = False
        self._abandon = abandon

    @property
    def alive(self) -> bool:
        return not self._chan.closed and not self._chan.eof_received

    def _send(self, data: bytes, deadline: float, timeout: float) -> None:
        # A node that stops reading (a full window, a cut link) would block sendall forever.
        self._chan.settimeout(max(0.01, deadline - self._clock()))
        try:
            self._chan.sendall(data)
        except socket.timeout:
            raise CommandTimeout(self.node_id, f"sending the request took past {timeout:g}s") from None
        finally:
            self._chan.settimeout(None)

    def _line(self) -> bytes | None:
        i = self._buf.find(b"\n", self._scanned)
        if i < 0:
            self._scanned = len(self._buf)
            return None
        line = bytes(self._buf[:i])
        del self._buf[:i + 1]
        self._scanned = 0
        return line

    def request(self, line: bytes, *, timeout: float) -> bytes:
        with self._lock:
            deadline = self._clock() + timeout
            try:
                self._send(line if line.endswith(b"\n") else line + b"\n", deadline, timeout)
                while True:
                    answer = self._line()
                    if answer is not None and not self._header_read:
                        self._header_read = True
                        self._process, rest = _split_header(answer + b"\n")
                        if self._process is not None:
                            continue
                    if answer is not None:
                        return answer
                    if len(self._buf) > MAX_OUTPUT_BYTES:
                        self._give_up()
                        raise OutputTooLarge(self.node_id, f"answered with more than {MAX_OUTPUT_BYTES >> 20} MiB and no end of line; not read")
                    got = False
                    while self._chan.recv_stderr_ready():
                        self._stderr = (self._stderr + self._chan.recv_stderr(_READ_CHUNK))[-_STDERR_KEPT:]
                        got = True
                    if self._chan.recv_ready():
                        data = self._chan.recv(_READ_CHUNK)
                        self._buf += data
                        got = True
                        if data:
                            continue
                    if not got and (self._chan.eof_received or self._chan.closed):
                        self._chan.settimeout(1.0)
                        rc = self._chan.recv_exit_status() if self._chan.exit_status_ready() else None
                        self.close()
                        raise StreamClosed(self.node_id, f"command ended (exit {rc})", rc, self._stderr)
                    left = deadline - self._clock()
                    if left <= 0:
                        self._give_up()
                        raise CommandTimeout(self.node_id, f"no answer within {timeout:g}s")
                    if not got:
                        _wait_readable(self._chan, min(left, 1.0))
            except CommandTimeout:
                self._give_up()
                raise
            except (paramiko.SSHException, EOFError, OSError) as exc:
                self._give_up()
                raise TransportError(self.node_id, f"connection lost: {exc or type(exc).__name__}") from None

    def _give_up(self) -> None:
        """Close the channel and have the command ended on the node, should closing not reach it."""
        if self._process is not None:
            self._abandon(self._process)
            self._process = None
        self.close()

    def take_process(self) -> str | None:
        """The command's "<pid> <start time>", handed over once (to be ended on the node if it outlives us)."""
        process, self._process = self._process, None
        return process

    def close(self) -> None:
        self._chan.close()


class SshTransport:
    """transport.Transport over one persistent SSH connection to one node."""

    def __init__(
        self,
        node: NodeSpec,
        *,
        connector: _Connector | None = None,
        min_backoff_s: float = 0.5,
        max_backoff_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        jitter: Callable[[], float] = random.random,
    ):
        if connector is None:  # standalone use; a TransportPool shares one connector among its nodes
            connector = _Connector(_Shared(None, 4))
        self.node_id = node.id
        self.node = node
        try:
            self.target = resolve_target(node.address, node.ssh, connector.shared.config)
        except ValueError as exc:  # a bad Port in ~/.ssh/config: this node cannot be reached, the others can
            raise TransportError(node.id, str(exc)) from None
        self._connector = connector
        self._lock = threading.Lock()
        self._conn: paramiko.Transport | None = None
        self._clock = clock
        self._min_backoff = min_backoff_s
        self._max_backoff = max_backoff_s
        self._jitter = jitter
        self._failures = 0
        self._retry_at = 0.0
        self._last_error: TransportError | None = None
        self._trust_when_failed: tuple | None = None  # known_hosts as it was when a host key was refused
        self._streams: dict[str, tuple[paramiko.Transport, _Stream]] = {}
        # Commands abandoned at their deadline, "<pid> <start time>", ended when the node answers again.
        self._abandoned: set[str] = set()
        self._reaping = False

    # -- connection -------------------------------------------------------

    def _connected(self) -> paramiko.Transport:
        with self._lock:
            if self._conn is not None and self._conn.is_active():
                return self._conn
            if self._conn is not None:
                self._conn.close()
                self._conn = None
                # Whatever ran on the dead connection may live on at the node (sshd there has not
                # noticed): end it once a new connection is up.
                self._drop_streams()
            now = self._clock()
            err = self._last_error
            if err is not None and not err.temporary and self._trust_stamp() != self._trust_when_failed:
                self._retry_at = now  # known_hosts was edited (a key trusted, a line removed): try now
            if err is not None and now < self._retry_at:
                # Broken recently: do not hammer it on every call; say why it is down.
                raise type(err)(self.node_id, err.reason)
            try:
                self._conn = self._connector.open(self.node_id, self.target, self.node.ssh)
            except TransportError as exc:
                self._failures += 1
                if exc.temporary:
                    # Capped exponential backoff, shortened by up to a quarter at random, so nodes
                    # that failed together (a switch reboot) do not all come back in lockstep.
                    delay = min(self._max_backoff, self._min_backoff * (2 ** (self._failures - 1)))
                    delay *= 1.0 - 0.25 * self._jitter()
                else:
                    # Permanent (a refused host key): stalled until known_hosts or the node's
                    # fleet.yaml entry changes (a new entry is a new transport), rechecked rarely.
                    delay = PERMANENT_RECHECK_S
                    self._trust_when_failed = self._trust_stamp()
                self._retry_at = now + delay
                self._last_error = exc
                raise
            self._failures = 0
            self._last_error = None
            return self._conn

    def _trust_stamp(self) -> tuple | None:
        try:
            st = os.stat(self.target.known_hosts)
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    @property
    def connected(self) -> bool:
        return self._conn is not None and self._conn.is_active()

    def connect(self) -> None:
        """Open the connection now (it is otherwise opened by the first command)."""
        self._connected()

    def _drop_streams(self) -> None:
        # Called with self._lock held. Closing a channel reaches the node only over a live
        # connection: each stream's command is remembered, to be ended if it is still there
        # when the node answers again (a stream that did end is told apart by its start time).
        for _, stream in self._streams.values():
            process = stream.take_process()
            if process is not None:
                self._abandoned.add(process)
            stream.close()
        self._streams.clear()

    def close(self) -> None:
        with self._lock:
            self._drop_streams()
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    # -- commands ---------------------------------------------------------

    @property
    def command_timeout_s(self) -> float:
        return float(self.node.ssh.command_timeout_s)

    def _abandon(self, process: str) -> None:
        with self._lock:
            self._abandoned.add(process)

    @property
    def abandoned(self) -> frozenset[str]:
        """Commands left running on the node past their deadline, not yet ended there."""
        with self._lock:
            return frozenset(self._abandoned)

    def _reap(self, conn: paramiko.Transport) -> None:
        """End on the node the commands abandoned at their deadline: it answers again."""
        with self._lock:
            if self._reaping or not self._abandoned:
                return
            self._reaping = True
            todo = sorted(self._abandoned)
        try:
            chan = conn.open_session(timeout=self.target.connect_timeout_s)
            result = self._run_on(chan, ["/bin/sh", "-c", _REAP, "llm-reconciler", *todo], None,
                                  min(self.command_timeout_s, 10.0), wrap=False)
            if result.rc == 0:
                with self._lock:
                    self._abandoned.difference_update(todo)
        except (TransportError, paramiko.SSHException, EOFError, OSError):
            pass  # still not answering: tried again with the next command
        finally:
            with self._lock:
                self._reaping = False

    def run(self, argv: Sequence[str], *, stdin: bytes | None = None, timeout: float | None = None) -> CommandResult:
        """Run argv on the node; `timeout` (default ssh.command_timeout_s) bounds it, sending stdin included."""
        if not argv:
            raise ValueError("empty argv")
        timeout = self.command_timeout_s if timeout is None else timeout
        for attempt in (1, 2):
            conn = self._connected()
            self._reap(conn)
            try:
                chan = conn.open_session(timeout=min(timeout, self.target.connect_timeout_s))
            except (paramiko.SSHException, EOFError, OSError) as exc:
                # The connection died between uses (node rebooted, sshd restarted):
                # nothing ran yet, so one fresh connection and one retry are safe.
                self.close()
                if attempt == 2:
                    raise TransportError(self.node_id, f"connection lost: {exc or type(exc).__name__}") from None
                continue
            return self._run_on(chan, argv, stdin, timeout)
        raise AssertionError("unreachable")

    def stream(self, key: str, argv: Sequence[str], *, preamble: bytes = b"", timeout: float | None = None) -> _Stream:
        """The running stream named `key`, started with argv (and `preamble` sent first) if it is not running.

        It lives as long as the connection: a reconnect starts it afresh, and
        closing the connection ends it (the remote command sees end of input).
        """
        timeout = self.command_timeout_s if timeout is None else timeout
        conn = self._connected()
        self._reap(conn)
        with self._lock:
            held = self._streams.get(key)
            if held is not None and held[0] is conn and held[1].alive:
                return held[1]
            if held is not None:
                held[1].close()
                del self._streams[key]
        try:
            chan = conn.open_session(timeout=min(timeout, self.target.connect_timeout_s))
            chan.exec_command(wrapped(argv))
            if preamble:
                chan.settimeout(timeout)
                chan.sendall(preamble)
                chan.settimeout(None)
        except socket.timeout:
            chan.close()
            raise CommandTimeout(self.node_id, f"sending {argv[0]} its program took past {timeout:g}s") from None
        except (paramiko.SSHException, EOFError, OSError) as exc:
            self.close()
            raise TransportError(self.node_id, f"connection lost: {exc or type(exc).__name__}") from None
        stream = _Stream(self.node_id, chan, self._clock, self._abandon)
        with self._lock:
            self._streams[key] = (conn, stream)
        return stream

    def _run_on(self, chan: paramiko.Channel, argv, stdin: bytes | None, timeout: float, *, wrap: bool = True) -> CommandResult:
        deadline = self._clock() + timeout
        out: list[bytes] = []
        err = b""
        size = 0
        process: str | None = None
        header = wrap  # the prologue's line is still to come
        try:
            chan.exec_command(wrapped(argv) if wrap else shlex.join(argv))
            try:
                if stdin:
                    # sendall blocks while the node does not read (a full window, a cut link):
                    # the command's deadline covers sending its input too.
                    chan.settimeout(max(0.01, deadline - self._clock()))
                    chan.sendall(stdin)
                    chan.settimeout(None)
                chan.shutdown_write()
            except socket.timeout:
                if header:  # the prologue's line is already there, unread: who to end later
                    _wait_readable(chan, 0.2)
                    if chan.recv_ready():
                        process, _ = _split_header(chan.recv(128))
                raise CommandTimeout(self.node_id, f"sending {argv[0]} its input took past {timeout:g}s") from None
            except OSError:
                # The command exited without reading all its input (a node whose python3
                # is something else): its output and exit status still say what happened.
                if not (chan.exit_status_ready() or chan.eof_received or chan.closed):
                    raise
            while True:
                while chan.recv_ready():
                    data = chan.recv(_READ_CHUNK)
                    if header:
                        out.append(data)
                        joined = b"".join(out)
                        if b"\n" in joined or len(joined) > 64:
                            process, rest = _split_header(joined)
                            out, header = [rest], False
                            size = len(rest)
                        continue
                    size += len(data)
                    if size > MAX_OUTPUT_BYTES:
                        raise OutputTooLarge(self.node_id, f"{argv[0]} printed more than {MAX_OUTPUT_BYTES >> 20} MiB; not read")
                    out.append(data)
                while chan.recv_stderr_ready():
                    err = (err + chan.recv_stderr(_READ_CHUNK))[-_STDERR_KEPT:]
                if chan.eof_received and chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                    break
                if chan.closed and not chan.recv_ready() and not chan.recv_stderr_ready():
                    break
                left = deadline - self._clock()
                if left <= 0:
                    raise CommandTimeout(self.node_id, f"{argv[0]} ran past {timeout:g}s")
                _wait_readable(chan, min(left, 1.0))
            rc = chan.recv_exit_status() if chan.exit_status_ready() else -1
            if header:  # ended before the prologue's line was complete
                process, rest = _split_header(b"".join(out))
                out = [rest]
        except (CommandTimeout, OutputTooLarge):
            if process is not None:
                self._abandon(process)
            raise
        except (paramiko.SSHException, EOFError, OSError) as exc:
            if process is not None:
                self._abandon(process)
            self.close()
            raise TransportError(self.node_id, f"connection lost while running {argv[0]}: {exc or type(exc).__name__}") from None
        finally:
            chan.close()
        # No exit status means the remote command died on a signal; report it like OpenSSH does.
        return CommandResult(255 if rc < 0 else rc, b"".join(out), err)


class TransportPool:
    """One transport per node, kept open across passes. `transport_for(node)` is what callers use.

    Local nodes get a LocalTransport; others an SshTransport whose connection
    is opened on first use and reused after. A node whose fleet.yaml entry
    changed gets a fresh transport.
    """

    def __init__(
        self,
        *,
        ssh_config_path: str | None = None,
        max_handshakes: int = 32,
        min_backoff_s: float = 0.5,
        max_backoff_s: float = 10.0,
    ):
        self._shared = _Shared(ssh_config_path, max_handshakes)
        self._connector = _Connector(self._shared)
        self._lock = threading.Lock()
        self._transports: dict[str, tuple[NodeSpec, Transport]] = {}
        self._backoff = (min_backoff_s, max_backoff_s)

    def transport_for(self, node: NodeSpec) -> Transport:
        with self._lock:
            held = self._transports.get(node.id)
            if held is not None and held[0] == node:
                return held[1]
            if held is not None:
                held[1].close()
            t: Transport
            if node.transport == "local":
                t = LocalTransport(node.id)
            else:
                t = SshTransport(
                    node, connector=self._connector, min_backoff_s=self._backoff[0], max_backoff_s=self._backoff[1]
                )
            self._transports[node.id] = (node, t)
            return t

    def forget(self, node_id: str) -> None:
        with self._lock:
            held = self._transports.pop(node_id, None)
        if held is not None:
            held[1].close()

    def close(self) -> None:
        with self._lock:
            held = list(self._transports.values())
            self._transports.clear()
        for _, t in held:
            t.close()
        self._connector.close()  # jump hosts last: the connections above ran through them

    def __enter__(self) -> "TransportPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
