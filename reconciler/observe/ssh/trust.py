"""What is trusted: host keys in known_hosts, and the private keys that log in.

Host keys are verified against the configured known_hosts file and nothing else: an unknown
or changed key is refused with a message naming the node and the key's SHA256 fingerprint,
the way OpenSSH prints it, so an operator can compare it with `ssh-keygen -lf`. There is no
auto-add: a reconciler that trusts the first key it sees hands every GPU in the fleet to
whoever answers first. known_hosts lines are read by paramiko's line parser (hashed names,
patterns, [host]:port); a key on the wire is compared with them by its SSH wire-format blob.
"""

from __future__ import annotations

import base64
import hashlib
import os
import threading
from dataclasses import dataclass

import asyncssh
import paramiko

from reconciler.errors import HostKeyError
from reconciler.observe.ssh.config import Target


def fingerprint(key: "paramiko.PKey | HostKey") -> str:
    """`SHA256:<base64, unpadded>`, as `ssh-keygen -lf` and OpenSSH's own messages print it."""
    blob = key.blob if isinstance(key, HostKey) else key.asbytes()
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


@dataclass(frozen=True)
class HostKey:
    """A public host key as SSH sends it: its type name and its wire-format blob."""

    kind: str
    blob: bytes

    @classmethod
    def of(cls, key: "paramiko.PKey | asyncssh.SSHKey") -> "HostKey":
        if isinstance(key, asyncssh.SSHKey):
            return cls(key.get_algorithm(), key.public_data)
        return cls(key.get_name(), key.asbytes())


class HostKeyIndex:
    """known_hosts keys by host name: a dict for plain names, so each connection's lookup costs the
    same at 4,000 lines as at 4 (paramiko's HostKeys scans every entry per lookup and per add);
    hashed names (`|1|salt|hash`) are matched the way paramiko matches them."""

    def __init__(self) -> None:
        self._plain: dict[str, dict[str, paramiko.PKey]] = {}
        self._hashed = paramiko.HostKeys()

    def add(self, name: str, key: paramiko.PKey) -> None:
        # A later line for the same name and key type replaces an earlier one, as in paramiko.
        if name.startswith("|1|"):
            self._hashed.add(name, key.get_name(), key)
        else:
            self._plain.setdefault(name, {})[key.get_name()] = key

    def lookup(self, name: str) -> dict[str, paramiko.PKey]:
        found = dict(self._plain.get(name, {}))
        hashed = self._hashed.lookup(name) if len(self._hashed) else None
        for kind, key in (hashed or {}).items():
            found.setdefault(kind, key)
        return found


@dataclass(frozen=True)
class KnownHosts:
    """A known_hosts file as read: its keys, or why it could not be read, and the lines skipped."""

    keys: HostKeyIndex | None
    problem: str | None = None  # "is missing", or "cannot be read (...)": nothing can be verified
    skipped: tuple[int, ...] = ()  # line numbers that hold no usable key
    revoked: tuple[paramiko.PKey, ...] = ()  # `@revoked` lines: never accepted, for any host


def load_known_hosts(path: str) -> KnownHosts:
    """Read a known_hosts file line by line, as OpenSSH does: an unreadable line is skipped.

    paramiko.HostKeys(path) raises on the first line whose key is not valid
    base64, which would make one stray line a traceback (or every node
    unreachable); a skipped line only trusts less, never more.
    """
    keys = HostKeyIndex()
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
                keys.add(name, entry.key)
        # @cert-authority: host certificates are not supported; such a line trusts nothing here.
    return KnownHosts(keys, None, tuple(skipped), tuple(revoked))


# The signature algorithms a host key of each type is offered under (rsa-sha2-* sign with an ssh-rsa key).
_ALGORITHMS_OF = {"ssh-rsa": ("rsa-sha2-512", "rsa-sha2-256", "ssh-rsa")}


class HostKeyCheck:
    """Verifies a server's key against known_hosts during key exchange; raises HostKeyError."""

    def __init__(self, node_id: str, target: Target, file: KnownHosts):
        self.node_id = node_id
        self.target = target
        self.file = file
        self.known = file.keys

    def _entry(self) -> dict:
        return self.known.lookup(self.target.known_hosts_name) if self.known is not None else {}

    def algorithms(self) -> list[str]:
        """Host key algorithms to ask for, those of the keys known_hosts holds for this host, as
        OpenSSH does: a host with several keys is then not reported "changed" for offering another."""
        out: list[str] = []
        for kind in self._entry():
            out.extend(a for a in _ALGORITHMS_OF.get(kind, (kind,)) if a not in out)
        return out

    def verify(self, offered: HostKey) -> None:
        name = self.target.known_hosts_name
        shown = f"{offered.kind} {fingerprint(offered)}"
        if self.known is None:
            raise HostKeyError(
                self.node_id,
                f"known_hosts file {self.target.known_hosts} {self.file.problem}, so the host key of {name} "
                f"({shown}) cannot be verified; refusing to connect",
            )
        if any(offered.blob == r.asbytes() for r in self.file.revoked):
            raise HostKeyError(
                self.node_id,
                f"host key of {name} ({shown}) is marked @revoked in {self.target.known_hosts}; refusing to connect",
            )
        entry = self._entry()
        if not entry:
            raise HostKeyError(
                self.node_id,
                f"host key of {name} is not in {self.target.known_hosts} ({shown}{self._skipped()}); "
                f"refusing to connect to an unknown host: verify the key, then add it to known_hosts",
            )
        expected = entry.get(offered.kind)
        if expected is None or expected.asbytes() != offered.blob:
            known = ", ".join(f"{k.get_name()} {fingerprint(k)}" for k in entry.values())
            raise HostKeyError(
                self.node_id,
                f"HOST KEY CHANGED for {name}: it offered {shown}, "
                f"{self.target.known_hosts} has {known}; refusing to connect (someone may be intercepting, "
                f"or the host was reinstalled: verify, then update known_hosts)",
            )

    def _skipped(self) -> str:
        n = len(self.file.skipped)
        if not n:
            return ""
        lines = ", ".join(str(i) for i in self.file.skipped[:10]) + (", ..." if n > 10 else "")
        return f"; {'lines' if n > 1 else 'line'} {lines} of it {'hold' if n > 1 else 'holds'} no usable key, skipped"


class Keyring:
    """known_hosts files (reread when they change) and private keys (read once), shared by a pool."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._host_keys: dict[str, tuple[float, KnownHosts]] = {}
        self._keys: dict[str, asyncssh.SSHKey | Exception] = {}

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
        if isinstance(exc, FileNotFoundError) or not isinstance(exc, Exception):
            return None  # a default identity that simply is not there: not worth a word
        if isinstance(exc, _Encrypted):
            return f"{path} is encrypted (load it into ssh-agent)"
        return f"{path} is unreadable ({exc})"

    def private_key(self, path: str) -> asyncssh.SSHKey | None:
        with self._lock:
            if path in self._keys:
                cached = self._keys[path]
                return None if isinstance(cached, Exception) else cached
        key = _read_private_key(path)
        with self._lock:
            self._keys[path] = key
        return None if isinstance(key, Exception) else key


class _Encrypted(Exception):
    """A private key file that needs a passphrase (the reconciler has none: ssh-agent holds such keys)."""


def _read_private_key(path: str) -> "asyncssh.SSHKey | Exception":
    try:
        return asyncssh.read_private_key(path)
    except (OSError, asyncssh.KeyImportError) as exc:
        first = exc
    try:
        # Told apart by type, not by wording: an encrypted key refuses a wrong passphrase with
        # KeyEncryptionError, anything else (junk, a public key) fails to import again.
        asyncssh.read_private_key(path, passphrase="\0not-the-passphrase")
    except asyncssh.KeyEncryptionError:
        return _Encrypted(path)
    except (OSError, ValueError):
        pass
    return first
