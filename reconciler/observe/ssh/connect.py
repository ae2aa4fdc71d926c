"""Opening authenticated SSH connections with asyncssh, in the pool's event loop.

TCP is opened here (so a refused port, an unreachable network, a name that does not resolve
and a timeout each get their own message), then asyncssh runs the handshake over it, or over
a channel of the jump host's connection for ProxyJump. The host key is checked by
trust.HostKeyCheck from asyncssh's validate_host_public_key hook; keys are offered as OpenSSH
offers them: the identity files, then the keys ssh-agent holds. Foreign exceptions (asyncssh,
socket) become TransportError / HostKeyError naming the node, here and once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import ipaddress
import logging
import os
import socket
import threading
from typing import Sequence

import asyncssh
from asyncssh.public_key import get_default_public_key_algs, get_public_key_algs

from reconciler.errors import TransportError, UsageError
from reconciler.model import SshSettings
from reconciler.observe.ssh.config import Target, load_ssh_config, parse_jump, resolve_target
from reconciler.observe.ssh.loop import EventLoop
from reconciler.observe.ssh.trust import HostKey, HostKeyCheck, Keyring, fingerprint

# asyncssh logs every connection at INFO and failures at WARNING; with no logging set up Python
# would print the warnings on stderr. Each failure reaches the caller as a TransportError naming
# the node instead.
logging.getLogger("asyncssh").addHandler(logging.NullHandler())
logging.getLogger("asyncssh").setLevel(logging.ERROR)
logging.getLogger("asyncssh").propagate = False

KEEPALIVE_S = 30
# AES-GCM first (asyncssh's default puts chacha20-poly1305 first): with AES-NI it costs about half
# the CPU per small packet (a probe round trip: 404 against 741 us, both ends in one process), and
# the daemon's one event loop does every node's crypto. Every cipher OpenSSH offers stays allowed.
ENCRYPTION_ALGS = ["aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "chacha20-poly1305@openssh.com",
                   "aes256-ctr", "aes192-ctr", "aes128-ctr"]
_PLAIN_HOST_KEY_ALGS = [alg.decode() for alg in get_default_public_key_algs()]
_SUPPORTED_HOST_KEY_ALGS = frozenset(alg.decode() for alg in get_public_key_algs())


class _Shared:
    """What every connection of one pool shares: parsed config, known_hosts and keys, handshake slots, the loop."""

    def __init__(self, ssh_config_path: str | None, max_handshakes: int):
        path = os.path.expanduser(ssh_config_path or "~/.ssh/config")
        try:
            self.config = load_ssh_config(path)
        except (OSError, ValueError) as exc:
            raise UsageError(f"{path}: cannot read this SSH config: {exc}") from None
        self.max_handshakes = max_handshakes
        self.keyring = Keyring()
        self.loop = EventLoop()


class Link:
    """One open, authenticated connection to a node (or a jump host)."""

    def __init__(self, conn: asyncssh.SSHClientConnection, client: "_Client", loop: EventLoop):
        self.conn = conn
        self._client = client
        self._loop = loop

    @property
    def active(self) -> bool:
        return not self._client.lost

    def close(self) -> None:
        self._loop.call(self.conn.close)


class _Client(asyncssh.SSHClient):
    """asyncssh's client hooks: the host key checked against known_hosts, the keys to offer."""

    def __init__(self, check: HostKeyCheck, keys: Sequence[tuple[str, asyncssh.SSHKey]], agent: str | None):
        self.check = check
        self.refusal: TransportError | None = None
        self.lost = False
        self.tried: list[str] = []
        self._keys = list(keys)
        self._agent_path = agent
        self._agent: asyncssh.SSHAgentClient | None = None

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True

    def validate_host_public_key(self, host, addr, port, key) -> bool:
        try:
            self.check.verify(HostKey.of(key))
        except TransportError as exc:
            self.refusal = exc
            return False
        return True

    async def public_key_auth_requested(self):
        # The identity files first, then ssh-agent's keys, as OpenSSH tries them; then no more.
        if self._keys:
            keys, self._keys = self._keys, []
            self.tried.extend(path for path, _ in keys)
            return [key for _, key in keys]
        if self._agent_path:
            path, self._agent_path = self._agent_path, None
            try:
                self._agent = await asyncssh.connect_agent(path)
                agent_keys = await self._agent.get_keys() if self._agent else []
            except (OSError, asyncssh.Error, ValueError):
                agent_keys = []
            self.tried.extend(f"agent key {fingerprint(HostKey(k.algorithm.decode(), k.public_data))}" for k in agent_keys)
            if agent_keys:
                return list(agent_keys)
        return None

    def auth_completed(self) -> None:
        self._close_agent()

    def _close_agent(self) -> None:
        if self._agent is not None:
            self._agent.close()
            self._agent = None


def _socket_error(node_id: str, target: Target, exc: BaseException) -> TransportError:
    where = f"{target.hostname}:{target.port}"
    if isinstance(exc, socket.gaierror):
        return TransportError(node_id, f"cannot resolve host name {target.hostname!r}: {exc.strerror}")
    if isinstance(exc, UnicodeError):  # the idna codec refuses it (an empty or over-long label) before any lookup
        return TransportError(node_id, f"cannot resolve host name {target.hostname!r}: not a valid host name ({exc})")
    if isinstance(exc, (socket.timeout, TimeoutError, asyncio.TimeoutError)):
        return TransportError(node_id, f"timed out connecting to {where} after {target.connect_timeout_s:g}s")
    if isinstance(exc, ConnectionRefusedError):
        return TransportError(node_id, f"connection refused by {where} (no SSH server listening)")
    assert isinstance(exc, OSError)
    if exc.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN):
        return TransportError(node_id, f"no route to {where} ({exc.strerror})")
    return TransportError(node_id, f"cannot connect to {where}: {exc.strerror or exc}")


async def _addresses(host: str, port: int) -> list[tuple]:
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:  # a name: looked up in the loop's resolver threads (a bounded few)
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        return [(family, type_, proto, addr) for family, type_, proto, _, addr in infos]
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    return [(family, socket.SOCK_STREAM, 0, (host, port))]


async def _tcp(target: Target) -> socket.socket:
    loop = asyncio.get_running_loop()
    last: OSError | None = None
    for family, type_, proto, addr in await _addresses(target.hostname, target.port):
        sock = socket.socket(family, type_, proto)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, addr)
        except OSError as exc:
            sock.close()
            last = exc
            continue
        except BaseException:
            sock.close()
            raise
        # Nagle off: every small request would otherwise wait for the previous ACK (~40 ms each).
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock
    raise last or OSError(errno.EHOSTUNREACH, "no address")


class _Connector:
    """Opens authenticated connections for one pool, hopping through ProxyJump hosts."""

    def __init__(self, shared: _Shared):
        self.shared = shared
        self._lock = threading.Lock()
        self._jumps: dict[tuple, Link] = {}
        self._state_generation = -1
        self._slots: asyncio.Semaphore | None = None
        self._jump_locks: dict[tuple, asyncio.Lock] = {}

    def open(self, node_id: str, target: Target, settings: SshSettings) -> Link:
        """A new connection to the node (blocks the calling thread, not the loop)."""
        return self.shared.loop.run(self.connect(node_id, target, settings))

    def _loop_state(self) -> asyncio.Semaphore:
        # asyncio primitives belong to one loop: a loop started afresh (after close) gets new ones.
        if self._state_generation != self.shared.loop.generation or self._slots is None:
            self._state_generation = self.shared.loop.generation
            self._slots = asyncio.Semaphore(self.shared.max_handshakes)
            self._jump_locks = {}
            self._jumps = {}
        return self._slots

    async def connect(self, node_id: str, target: Target, settings: SshSettings) -> Link:
        self._loop_state()
        if not target.proxy_jump:
            return await self._direct(node_id, target)
        via = None
        for hop in [h.strip() for h in target.proxy_jump.split(",") if h.strip()]:
            via = await self._jump(node_id, self._hop_target(node_id, hop, target, settings), via)
        return await self._handshake(node_id, target, tunnel=via)

    async def _direct(self, node_id: str, target: Target) -> Link:
        try:
            sock = await asyncio.wait_for(_tcp(target), target.connect_timeout_s)
        except (OSError, UnicodeError, asyncio.TimeoutError) as exc:
            raise _socket_error(node_id, target, exc) from None
        try:
            return await self._handshake(node_id, target, sock=sock)
        except BaseException:
            sock.close()
            raise

    def _hop_target(self, node_id: str, hop: str, target: Target, settings: SshSettings) -> Target:
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
        return dataclasses.replace(hop_target, proxy_jump=None, identity_files=identities)

    async def _jump(self, node_id: str, hop: Target, via: Link | None) -> Link:
        key = (hop.hostname, hop.port, hop.user, id(via) if via else None)
        # One connection per jump host, however many nodes behind it connect at once.
        async with self._jump_locks.setdefault(key, asyncio.Lock()):
            held = self._jumps.get(key)
            if held is not None and held.active:
                return held
            try:
                link = await (self._direct(node_id, hop) if via is None else self._handshake(node_id, hop, tunnel=via))
            except TransportError as exc:
                raise type(exc)(node_id, f"via jump host {hop.label}: {exc.reason}") from None
            self._jumps[key] = link
            return link

    def _client(self, node_id: str, target: Target) -> _Client:
        keyring = self.shared.keyring
        check = HostKeyCheck(node_id, target, keyring.host_keys(target.known_hosts))
        keys = [(path, key) for path in target.identity_files if (key := keyring.private_key(path)) is not None]
        return _Client(check, keys, os.environ.get("SSH_AUTH_SOCK") or None)

    async def _handshake(self, node_id: str, target: Target, *, sock: socket.socket | None = None,
                         tunnel: Link | None = None) -> Link:
        client = self._client(node_id, target)
        where = f"{target.hostname}:{target.port}"
        options = dict(
            client_factory=lambda: client, username=target.user, known_hosts=([], [], []),
            client_keys=None, agent_path=None, password_auth=False, kbdint_auth=False, gss_auth=False,
            gss_kex=False, host_based_auth=False, config=None, keepalive_interval=KEEPALIVE_S,
            login_timeout=target.connect_timeout_s, connect_timeout=None, agent_forwarding=False,
            encryption_algs=ENCRYPTION_ALGS,
        )
        # The key types known_hosts holds for this host, else plain keys only: a host certificate
        # would be judged by CAs, and known_hosts trusts none (no @cert-authority support).
        known = [alg for alg in client.check.algorithms() if alg in _SUPPORTED_HOST_KEY_ALGS]
        options["server_host_key_algs"] = known or _PLAIN_HOST_KEY_ALGS
        if tunnel is not None:
            options.update(host=target.hostname, port=target.port, tunnel=tunnel.conn)
        else:
            options.update(sock=sock)
        async with self._loop_state():
            try:
                conn = await asyncio.wait_for(asyncssh.connect(**options), target.connect_timeout_s)
            except asyncio.TimeoutError:
                raise TransportError(node_id, f"SSH handshake with {where} timed out after {target.connect_timeout_s:g}s") from None
            except asyncssh.ChannelOpenError as exc:
                raise TransportError(node_id, f"jump host could not open a channel to {where}: {exc.reason}") from None
            except asyncssh.PermissionDenied:
                raise self._refused_login(node_id, target, client) from None
            except (asyncssh.Error, OSError, ValueError) as exc:
                if client.refusal is not None:
                    raise client.refusal from None
                raise TransportError(node_id, f"SSH handshake with {where} failed: {exc or type(exc).__name__}") from None
            finally:
                client._close_agent()
        return Link(conn, client, self.shared.loop)

    def _refused_login(self, node_id: str, target: Target, client: _Client) -> TransportError:
        if client.refusal is not None:
            return client.refusal
        if not client.tried:
            problems = [p for p in (self.shared.keyring.key_problem(f) for f in target.identity_files) if p]
            detail = "; ".join(problems) if problems else f"none of {', '.join(target.identity_files)} exists"
            return TransportError(node_id, f"no usable private key to log in as {target.user}: {detail}")
        return TransportError(
            node_id, f"authentication refused for {target.user}@{target.hostname} with key {', '.join(client.tried)}"
        )

    def close(self) -> list[Link]:
        """The jump hosts' connections, forgotten here, for the caller to close (after the nodes behind them)."""
        with self._lock:
            jumps = list(self._jumps.values())
            self._jumps = {}
        return jumps
