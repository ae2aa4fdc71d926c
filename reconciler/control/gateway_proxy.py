"""`reconciler gateway`: the real LiteLLM proxy on status/gateway/litellm.yaml, following the file with
no connection refused and no stream cut, and saying what it serves (SPEC 13).

What LiteLLM 1.106.12 can do, read in its source (litellm/proxy/):
- it reads its config once, at start (proxy_server.proxy_startup_event -> ProxyConfig.load_config);
  `--reload` is uvicorn's dev reloader: a restart, refusing connections while it starts;
- `--run_gunicorn` replaces workers on SIGHUP; an old worker closes its idle keep-alive connections
  under the clients (a request sent on one at that moment fails), and nothing says when every worker
  serves the new file;
- its model-management API (/model/new, /model/delete) keeps models in its database
  (store_model_in_db, Postgres): a database to run, and the reconciler writes a file.

So the front is ours: this module holds the listening socket and every client connection (uvicorn),
and forwards each request to the LiteLLM in force (httpx, streamed chunk by chunk). A changed file
starts a second LiteLLM on a private loopback port, on a copy of exactly the bytes it hashed; once it
answers /health/liveliness, new requests go to it, requests in flight finish on the old one, and the
old one is stopped once the front counts none on it. The front knows the moment the old file stops
getting requests: it writes status/gateway/served.json then (gateway.Served: the sha256 and the
api_bases of what it serves), and the pass reads that before it stops a copy. Its mtime is the
heartbeat (touched, not rewritten, so a daemon committing status/ commits only real changes).
A LiteLLM that does not start on a new file is stopped, the old one keeps serving, and served.json
says why (`refused`); the pass keeps the copies that file would have let go.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path

import httpx
import uvicorn
import yaml

from reconciler import pyyaml_bounded
from reconciler.errors import ReconcilerError, UsageError
from reconciler.record.gateway import SERVED_HEARTBEAT_S, Served, litellm_api_bases
from reconciler.record.status.gateway_files import GATEWAY_DIR, LITELLM_FILE, write_served
from reconciler.record.status.files import status_dir

WATCH_S = 0.25  # how often the file is looked at (a read and a hash of a few KiB)
START_TIMEOUT_S = 180.0  # a LiteLLM that does not answer /health/liveliness by then did not take the file
STOP_GRACE_S = 10.0
# A file refused is tried again only once it changes, or after this long (a transient failure).
RETRY_REFUSED_S = 60.0
# Headers of one hop (RFC 9110 7.6.1): never forwarded.
HOP_BY_HOP = {b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te", b"trailer",
              b"transfer-encoding", b"upgrade"}
# Set again by the client that forwards the request (httpx: the backend's host, the body's length).
NOT_FORWARDED = HOP_BY_HOP | {b"host", b"content-length"}


def bind(address: str) -> socket.socket:
    """The front's listening socket, bound before anything starts: an address in use is a clear error
    at once. HOST:PORT or [V6]:PORT; no host means loopback."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise UsageError(f"--address {address!r}: expected HOST:PORT, e.g. 127.0.0.1:4000")
    host = host.strip("[]") or "127.0.0.1"
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, int(port)))
    except OSError as exc:
        sock.close()
        raise ReconcilerError(f"cannot serve the gateway on {address}: {exc.strerror or exc}") from exc
    sock.listen(1024)
    return sock


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Backend:
    """One LiteLLM process on a loopback port, serving one file (by its sha256); `inflight` counts the
    requests the front has sent it and not finished."""

    def __init__(self, sha256: str, text: bytes, argv_extra: list[str], litellm: str, workdir: Path, log):
        self.sha256, self.port, self.inflight = sha256, free_port(), 0
        self.api_bases = litellm_api_bases(_yaml(text))
        self.config = workdir / f"litellm-{sha256[:16]}.yaml"
        self.config.write_bytes(text)
        self.logfile = workdir / f"litellm-{sha256[:16]}-{self.port}.log"
        self.log = log
        argv = [litellm, "--config", str(self.config), "--host", "127.0.0.1", "--port", str(self.port), *argv_extra]
        with self.logfile.open("wb") as out:
            self.proc = _spawn(argv, out)

    def last_lines(self, n: int = 3) -> str:
        try:
            lines = [ln for ln in self.logfile.read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return ""
        return " | ".join(lines[-n:])[-600:]

    async def ready(self, client: httpx.AsyncClient, timeout_s: float) -> str | None:
        """None once it answers /health/liveliness; else why not, in words."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            code = self.proc.poll()
            if code is not None:
                return f"LiteLLM exited with {code} before it served: {self.last_lines() or 'no output'}"
            try:
                r = await client.get(f"http://127.0.0.1:{self.port}/health/liveliness", timeout=2.0)
                if r.status_code == 200:
                    return None
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.2)
        return f"LiteLLM did not answer /health/liveliness within {timeout_s:g} s: {self.last_lines() or 'no output'}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(STOP_GRACE_S)
            except Exception:  # noqa: BLE001 - it did not go on TERM: KILL, then reap
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(5)
        try:
            self.config.unlink()
        except OSError:
            pass


def _spawn(argv: list[str], out):
    import subprocess

    # Its own process group: the front stops it (and anything it started) by pid, never by name.
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=True)


def _yaml(text: bytes):
    try:
        return pyyaml_bounded.load(text, yaml.SafeLoader)
    except yaml.YAMLError:
        return None


class Gateway:
    """The front and the LiteLLM processes behind it, for one catalog."""

    def __init__(self, catalog: str | os.PathLike, litellm: str, extra: list[str], log=None):
        self.root = Path(catalog)
        self.file = status_dir(self.root) / GATEWAY_DIR / LITELLM_FILE
        self.litellm, self.extra = litellm, list(extra)
        self.log = log or (lambda msg: print(f"reconciler gateway: {msg}", file=sys.stderr, flush=True))
        self.workdir = Path(tempfile.mkdtemp(prefix="reconciler-gateway-"))
        self.current: Backend | None = None
        self.retiring: list[Backend] = []
        self.served: Served | None = None
        self.refused: tuple[str, float] | None = None  # (sha256, when) of the last file not taken
        self.client: httpx.AsyncClient | None = None
        self.stopping = asyncio.Event()
        self._stops: list[asyncio.Task] = []

    # ------------------------------------------------------------ the front: one ASGI app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        backend = self.current
        if backend is None:
            await _answer(send, 503, b"reconciler gateway: no LiteLLM serves yet (see its log)\n")
            return
        backend.inflight += 1  # before any await: the switch never stops a backend a request just picked
        try:
            await self._forward(backend, scope, receive, send)
        finally:
            backend.inflight -= 1

    async def _forward(self, backend: Backend, scope, receive, send) -> None:
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        path = scope.get("raw_path") or scope["path"].encode()
        query = scope.get("query_string") or b""
        url = f"http://127.0.0.1:{backend.port}{path.decode('latin-1')}" + (f"?{query.decode('latin-1')}" if query else "")
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in NOT_FORWARDED]
        request = self.client.build_request(scope["method"], url, headers=headers, content=bytes(body))
        try:
            response = await self.client.send(request, stream=True)
        except httpx.HTTPError as exc:
            await _answer(send, 502, f"reconciler gateway: LiteLLM did not answer: {type(exc).__name__}\n".encode())
            return
        try:
            await send({"type": "http.response.start", "status": response.status_code,
                        "headers": [(k, v) for k, v in response.headers.raw if k.lower() not in HOP_BY_HOP]})
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await response.aclose()

    # ------------------------------------------------------------ following the file

    async def beat(self) -> None:
        """Touch served.json every SERVED_HEARTBEAT_S, on its own: a LiteLLM taking a minute to start on
        a new file must not make the report look like that of a gateway gone (the pass would then count
        settle_s and stop copies the LiteLLM in force still routes to)."""
        while not self.stopping.is_set():
            self._heartbeat()
            try:
                await asyncio.wait_for(self.stopping.wait(), SERVED_HEARTBEAT_S)
            except asyncio.TimeoutError:
                pass

    async def follow(self) -> None:
        """Look at the file every WATCH_S; a new content is taken over by a new LiteLLM."""
        while not self.stopping.is_set():
            try:
                text = self.file.read_bytes()
            except OSError:
                text = None
            if text is not None:
                sha = hashlib.sha256(text).hexdigest()
                if self._wants(sha):
                    await self.take(sha, text)
            self._reap_retired()
            if self.current is not None and self.current.proc.poll() is not None:
                # The LiteLLM in force died: start it again on the same file (requests get 502 meanwhile).
                self.log(f"LiteLLM (pid {self.current.proc.pid}) exited with {self.current.proc.returncode}: "
                         f"starting it again: {self.current.last_lines()}")
                dead, self.current = self.current, None
                dead.stop()
                continue
            try:
                await asyncio.wait_for(self.stopping.wait(), WATCH_S)
            except asyncio.TimeoutError:
                pass

    def _wants(self, sha: str) -> bool:
        if self.current is not None and self.current.sha256 == sha:
            return False
        if self.refused is not None and self.refused[0] == sha and time.monotonic() - self.refused[1] < RETRY_REFUSED_S:
            return False
        return True

    async def take(self, sha: str, text: bytes) -> None:
        """A new LiteLLM on this file; in force once it answers, else refused with why."""
        new = Backend(sha, text, self.extra, self.litellm, self.workdir, self.log)
        self.log(f"starting LiteLLM (pid {new.proc.pid}, port {new.port}) on litellm.yaml {sha[:12]}")
        why = await new.ready(self.client, START_TIMEOUT_S)
        if why is not None:
            await asyncio.to_thread(new.stop)
            self.refused = (sha, time.monotonic())
            self.log(f"kept litellm.yaml {self.current.sha256[:12] if self.current else '(none)'}: {why}")
            self._write_served(refused_sha=sha, refused=why)
            return
        old, self.current = self.current, new  # new requests go to it from here
        self.refused = None
        self._write_served(since=time.time())
        self.log(f"serving litellm.yaml {sha[:12]} ({len(new.api_bases)} entries) through pid {new.proc.pid}"
                 + (f"; pid {old.proc.pid} finishes its {old.inflight} requests in flight, then stops" if old else ""))
        if old is not None:
            self.retiring.append(old)

    def _reap_retired(self) -> None:
        for b in list(self.retiring):
            if b.inflight == 0:
                self.retiring.remove(b)
                # Off the loop: a LiteLLM that takes its time over TERM must not hold up the front.
                self._stops.append(asyncio.create_task(asyncio.to_thread(b.stop)))

    # ------------------------------------------------------------ what it says it serves

    def _write_served(self, since: float | None = None, refused_sha: str = "", refused: str = "") -> None:
        cur = self.current
        if cur is None:
            base = Served("", (), time.time(), time.time(), os.getpid())
        else:
            base = Served(cur.sha256, cur.api_bases, since if since is not None else (self.served.since if self.served else time.time()),
                          time.time(), os.getpid())
        self.served = Served(base.sha256, base.api_bases, base.since, base.alive_at, base.pid, refused_sha, refused)
        try:
            write_served(self.root, self.served)
            self._touch()
        except OSError as exc:
            self.log(f"cannot write {self.file.parent / 'served.json'}: {exc}")

    def _heartbeat(self) -> None:
        if self.served is not None:
            self._touch()

    def _touch(self) -> None:
        try:
            os.utime(self.file.parent / "served.json")
        except OSError:
            pass

    def withdraw(self) -> None:
        """On the way out: no report, so the pass counts gateway.settle_s rather than trust a gone gateway."""
        try:
            (self.file.parent / "served.json").unlink()
        except OSError:
            pass

    # ------------------------------------------------------------ running it

    async def run(self, sock: socket.socket) -> None:
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0),
                                        limits=httpx.Limits(max_connections=None, max_keepalive_connections=64))
        config = uvicorn.Config(self, log_level="warning", access_log=False, lifespan="off", server_header=False,
                                date_header=False, timeout_keep_alive=30, timeout_graceful_shutdown=STOP_GRACE_S)
        server = uvicorn.Server(config)
        server.install_signal_handlers = lambda: None  # ours below: stop following, then let uvicorn finish
        loop = asyncio.get_running_loop()

        def on_signal() -> None:
            self.stopping.set()
            server.should_exit = True

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal)
        follower, beater = asyncio.create_task(self.follow()), asyncio.create_task(self.beat())
        try:
            await server.serve(sockets=[sock])
        finally:
            self.stopping.set()
            await asyncio.gather(follower, beater, return_exceptions=True)
            self.withdraw()
            await asyncio.gather(*self._stops, return_exceptions=True)
            for b in [*self.retiring, *([self.current] if self.current else [])]:
                b.stop()
            await self.client.aclose()
            try:
                for p in self.workdir.iterdir():
                    p.unlink()
                self.workdir.rmdir()
            except OSError:
                pass


async def _answer(send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
