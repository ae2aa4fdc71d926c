"""etcd's v3 API, through the JSON gateway every etcd serves on its client port (`/v3/...`, keys and
values base64), over the stdlib's http.client.

Why not a client library: python-etcd3 is unmaintained and breaks on current protobuf, and the
maintained gRPC clients pull in grpcio (a large binary wheel) for five calls. The gateway is part of
etcd itself (3.4 serves /v3/), needs nothing new on a management host, and TLS is the stdlib's ssl.

Only what the election and the state in etcd need: a lease (grant, keep alive, revoke), range, a
transaction, put and delete. Every failure is an EtcdUnavailable with the endpoint and the reason;
a certificate that cannot be read is an EtcdConfigError naming the file.
"""

from __future__ import annotations

import base64
import http.client
import json
import ssl
import threading
from dataclasses import dataclass
from typing import Sequence
from urllib.parse import urlsplit

from reconciler.errors import ReconcilerError, parse_json

REQUEST_TIMEOUT_S = 2.0  # per endpoint: a keepalive must fail over well inside a renew deadline


class EtcdUnavailable(ReconcilerError):
    """No endpoint answered (or every one refused): temporary, tried again."""


class EtcdConfigError(ReconcilerError):
    """The TLS files of leader.etcd cannot be used: permanent until fleet.yaml or the files change."""


@dataclass(frozen=True)
class KeyValue:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int


def b64(text: str | bytes) -> str:
    return base64.b64encode(text.encode() if isinstance(text, str) else text).decode()


def prefix_end(prefix: str) -> str:
    """The range end that covers every key starting with `prefix` (etcd's clientv3.GetPrefixRangeEnd)."""
    raw = bytearray(prefix.encode())
    for i in range(len(raw) - 1, -1, -1):
        if raw[i] < 0xFF:
            raw[i] += 1
            return bytes(raw[: i + 1]).decode("latin-1")
    return "\0"


def tls_context(ca_file: str | None, cert_file: str | None, key_file: str | None) -> ssl.SSLContext:
    """The client's TLS context; a file that is missing or not a certificate/key is named."""
    try:
        context = ssl.create_default_context(cafile=ca_file) if ca_file else ssl.create_default_context()
    except (OSError, ssl.SSLError) as exc:
        raise EtcdConfigError(f"leader.etcd.ca_file {ca_file}: {_ssl_reason(exc)}") from None
    if cert_file or key_file:
        try:
            context.load_cert_chain(cert_file, key_file)
        except (OSError, ssl.SSLError) as exc:
            raise EtcdConfigError(f"leader.etcd.cert_file {cert_file} / key_file {key_file}: "
                                  f"{_ssl_reason(exc)}") from None
    return context


def _ssl_reason(exc: Exception) -> str:
    if isinstance(exc, ssl.SSLError):
        return f"not a usable PEM certificate or key ({exc.reason or exc})"
    return getattr(exc, "strerror", None) or str(exc)


class EtcdClient:
    """One client for a list of endpoints: a request goes to the last endpoint that answered, and on
    to the next when it does not (a member down, restarted, or cut off)."""

    def __init__(self, endpoints: Sequence[str], *, ca_file: str | None = None, cert_file: str | None = None,
                 key_file: str | None = None, timeout_s: float = REQUEST_TIMEOUT_S):
        self.endpoints = [urlsplit(e) for e in endpoints]
        self.timeout_s = timeout_s
        tls = any(e.scheme == "https" for e in self.endpoints)
        self._tls = tls_context(ca_file, cert_file, key_file) if tls else None
        # Named in a TLS failure: which files this host presented and trusted.
        self._tls_files = ", ".join(f"{k} {v}" for k, v in (("ca_file", ca_file), ("cert_file", cert_file)) if v)
        self._good = 0
        self._lock = threading.Lock()

    # ------------------------------------------------------------ wire

    def call(self, path: str, body: dict) -> dict:
        """POST `body` to /v3/<path> on the first endpoint that answers; its JSON answer."""
        data = json.dumps(body).encode()
        reasons = []
        with self._lock:
            start = self._good
        for k in range(len(self.endpoints)):
            i = (start + k) % len(self.endpoints)
            url = self.endpoints[i]
            try:
                answer = self._post(url, "/v3/" + path, data)
            except _Refused as exc:  # etcd answered: an error that another member would answer too
                raise EtcdUnavailable(f"etcd {url.netloc} refused {path}: {exc}") from None
            except (OSError, http.client.HTTPException, ValueError) as exc:
                files = f" (leader.etcd {self._tls_files})" if isinstance(exc, ssl.SSLError) and self._tls_files else ""
                reasons.append(f"{url.netloc}: {_reason(exc)}{files}")
                continue
            with self._lock:
                self._good = i
            return answer
        raise EtcdUnavailable("no etcd endpoint answered (" + "; ".join(reasons) + ")")

    def _post(self, url, path: str, data: bytes) -> dict:
        if url.scheme == "https":
            conn = http.client.HTTPSConnection(url.hostname, url.port, timeout=self.timeout_s, context=self._tls)
        else:
            conn = http.client.HTTPConnection(url.hostname, url.port, timeout=self.timeout_s)
        try:
            conn.request("POST", path, body=data, headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            raw = response.read(16 << 20)
        finally:
            conn.close()
        answer = parse_json(raw or b"{}")
        if response.status >= 500 and isinstance(answer, dict) and answer.get("code") == 14:
            raise ConnectionError(answer.get("message") or "unavailable")  # a member without a quorum
        if response.status != 200:
            message = answer.get("message") or answer.get("error") if isinstance(answer, dict) else None
            raise _Refused(f"HTTP {response.status}: {message or raw[:200]!r}")
        if "error" in answer and "result" not in answer:
            raise _Refused(str(answer["error"]))
        return answer.get("result", answer) if isinstance(answer.get("result"), dict) else answer

    # ------------------------------------------------------------ leases

    def grant(self, ttl_s: int) -> int:
        answer = self.call("lease/grant", {"TTL": int(ttl_s), "ID": 0})
        return int(answer["ID"])

    def keepalive(self, lease: int) -> int:
        """The lease's TTL after renewing it; 0 when it has expired (or was revoked)."""
        answer = self.call("lease/keepalive", {"ID": lease})
        return int(answer.get("TTL") or 0)

    def revoke(self, lease: int) -> None:
        try:
            self.call("lease/revoke", {"ID": lease})
        except EtcdUnavailable:
            pass  # it expires by itself

    # ------------------------------------------------------------ keys

    def range(self, key: str, *, prefix: bool = False, sort_by_create: bool = False, limit: int = 0) -> list[KeyValue]:
        body: dict = {"key": b64(key)}
        if prefix:
            body["range_end"] = b64(prefix_end(key).encode("latin-1"))
        if sort_by_create:
            body["sort_order"], body["sort_target"] = "ASCEND", "CREATE"
        if limit:
            body["limit"] = limit
        return [_kv(kv) for kv in self.call("kv/range", body).get("kvs", [])]

    def get(self, key: str) -> KeyValue | None:
        found = self.range(key)
        return found[0] if found else None

    def create(self, key: str, value: bytes, lease: int) -> tuple[bool, KeyValue | None]:
        """Put `key` only if it does not exist (create_revision == 0): (created, the key as it is now)."""
        answer = self.call("kv/txn", {
            "compare": [{"key": b64(key), "result": "EQUAL", "target": "CREATE", "create_revision": "0"}],
            "success": [{"request_put": {"key": b64(key), "value": b64(value), "lease": str(lease)}}],
            "failure": [{"request_range": {"key": b64(key)}}],
        })
        return bool(answer.get("succeeded")), self.get(key)

    def put_if(self, key: str, value: bytes, *, guard_key: str, guard_create_revision: int) -> bool:
        """Put `key` only while `guard_key` is still the one created at that revision: a leader's write
        that a deposed leader cannot make (its campaign key is gone once its lease expired)."""
        answer = self.call("kv/txn", {
            "compare": [{"key": b64(guard_key), "result": "EQUAL", "target": "CREATE",
                         "create_revision": str(guard_create_revision)}],
            "success": [{"request_put": {"key": b64(key), "value": b64(value)}}],
        })
        return bool(answer.get("succeeded"))

    def put(self, key: str, value: bytes) -> None:
        self.call("kv/put", {"key": b64(key), "value": b64(value)})

    def delete(self, key: str) -> None:
        self.call("kv/deleterange", {"key": b64(key)})


class _Refused(Exception):
    pass


def _kv(raw: dict) -> KeyValue:
    return KeyValue(
        key=base64.b64decode(raw.get("key", "")).decode(errors="replace"),
        value=base64.b64decode(raw.get("value", "")),
        create_revision=int(raw.get("create_revision") or 0),
        mod_revision=int(raw.get("mod_revision") or 0),
        lease=int(raw.get("lease") or 0),
    )


def _reason(exc: Exception) -> str:
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"TLS: {exc.verify_message or exc}"
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, ValueError):
        return "answered something that is not JSON"
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
