#!/usr/bin/env python3
"""A small real engine with a real load, for autoscaling tests (stdlib only).

    load_engine.py --port P [--host H] [--parallel N] [--serve-s S] [--metrics MODE]
                   [--hold-until FILE] [--max-hold-s S]

POST /v1/completions holds one of N slots for S seconds (the rest wait for a slot, as
llama-server's deferred requests do) and answers JSON. With --hold-until, a request in its
slot first waits until FILE exists (at most --max-hold-s), so a test holds a load steady for
as long as it needs and ends it at once; a request whose JSON body says "hold": false is
not held (a probe that the server answers completions). GET /metrics reports, as Prometheus
exposition text, `load:requests_running` and `load:requests_waiting` counted from the requests
actually in flight. GET /health answers 200.

--metrics MODE makes /metrics misbehave, as a broken engine's does: ok (default), missing (404),
garbage (not exposition text), nan, negative, slow (answers after 30 s), absent (the series
are not in it). MODE may also be read from the file named by --metrics-file on each request,
so a test can break a running engine.
"""
import argparse
import json
import os
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

p = argparse.ArgumentParser()
p.add_argument("--host", default="127.0.0.1")
p.add_argument("--port", type=int, required=True)
p.add_argument("--parallel", type=int, default=1)
p.add_argument("--serve-s", type=float, default=1.0)
p.add_argument("--metrics", default="ok")
p.add_argument("--metrics-file", default="")
p.add_argument("--hold-until", default="")
p.add_argument("--max-hold-s", type=float, default=120.0)
args, _extra = p.parse_known_args()

slots = threading.BoundedSemaphore(args.parallel)
lock = threading.Lock()
counts = {"running": 0, "waiting": 0}


def mode() -> str:
    if args.metrics_file:
        try:
            with open(args.metrics_file) as f:
                return f.read().strip() or args.metrics
        except OSError:
            pass
    return args.metrics


def exposition(m: str) -> bytes:
    with lock:
        running, waiting = counts["running"], counts["waiting"]
    if m == "garbage":
        return b"{not: exposition} <html>\x00\x01 load:requests_running{ 3\n"
    if m == "absent":
        return b"# TYPE other_series gauge\nother_series 1\n"
    if m == "nan":
        running = float("nan")
    if m == "negative":
        waiting = -2
    return (
        "# HELP load:requests_running Requests being served.\n# TYPE load:requests_running gauge\n"
        f"load:requests_running {running}\n"
        "# HELP load:requests_waiting Requests waiting for a slot.\n# TYPE load:requests_waiting gauge\n"
        f"load:requests_waiting {waiting}\n"
    ).encode()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _send(self, code: int, body: bytes, ctype: str = "text/plain") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):  # noqa: N802
        if self.path == "/health":
            self._send(200, b"ok")
        elif self.path == "/metrics":
            m = mode()
            if m == "missing":
                self._send(404, b"no metrics")
                return
            if m == "slow":
                time.sleep(30)
            self._send(200, exposition(m))
        else:
            self._send(404, b"not found")

    def do_POST(self):  # noqa: N802
        length = int(self.headers.get("Content-Length") or 0)
        try:
            hold = json.loads(self.rfile.read(length) or b"{}").get("hold", True) is not False
        except (ValueError, AttributeError):
            hold = True
        with lock:
            counts["waiting"] += 1
        with slots:
            with lock:
                counts["waiting"] -= 1
                counts["running"] += 1
            try:
                if args.hold_until and hold:
                    deadline = time.monotonic() + args.max_hold_s
                    while not os.path.exists(args.hold_until) and time.monotonic() < deadline:
                        time.sleep(0.05)
                time.sleep(args.serve_s)
            finally:
                with lock:
                    counts["running"] -= 1
        self._send(200, json.dumps({"choices": [{"text": "ok", "index": 0}], "pid": os.getpid()}).encode(),
                   "application/json")

    def log_message(self, *a):
        pass


signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
server = ThreadingHTTPServer((args.host, args.port), Handler)
server.daemon_threads = True
print(f"load engine on {args.host}:{args.port}", flush=True)
server.serve_forever()
