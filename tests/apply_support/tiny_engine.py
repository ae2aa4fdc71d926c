#!/usr/bin/env python3
"""A small real engine for apply tests: binds a port, answers /health, records what it was given.

    tiny_engine.py --host H --port P --record FILE [--ready-after S] [--never-ready]
                   [--ignore-term] [--child] [--exit-after S] [ANY EXTRA ARGS ...]

It writes {"argv", "env", "pid"} as JSON to FILE before serving, prints a
line to stdout (so the log has something), and serves GET /health: 503
until ready, then 200. Extra arguments are accepted and recorded verbatim.
"""
import argparse
import json
import os
import signal
import socketserver
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

p = argparse.ArgumentParser()
p.add_argument("--host", default="127.0.0.1")
p.add_argument("--port", type=int, required=True)
p.add_argument("--record", required=True)
p.add_argument("--ready-after", type=float, default=0.0)
p.add_argument("--never-ready", action="store_true")
p.add_argument("--ignore-term", action="store_true")
p.add_argument("--child", action="store_true", help="spawn a child process in the same group")
p.add_argument("--exit-after", type=float, default=None)
args, extra = p.parse_known_args()

child = None
if args.child:
    child = subprocess.Popen(["sleep", "300"])
record = {"argv": sys.argv[1:], "extra": extra, "env": dict(os.environ), "pid": os.getpid(),
          "child": child.pid if child else None}
tmp = args.record + ".tmp"
with open(tmp, "w") as f:
    json.dump(record, f)
os.replace(tmp, args.record)

if args.ignore_term:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))

born = time.monotonic()


class Health(BaseHTTPRequestHandler):
    def do_GET(self):
        ready = not args.never_ready and time.monotonic() - born >= args.ready_after
        self.send_response(200 if ready and self.path == "/health" else 503)
        self.end_headers()
        self.wfile.write(b"ok" if ready else b"loading")

    def log_message(self, *a):
        pass


class Server(ThreadingHTTPServer):
    def server_bind(self):
        # HTTPServer.server_bind asks reverse DNS for its own name (socket.getfqdn): seconds
        # of timeout on a test node that has no resolver. The name is never used.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]


server = Server((args.host, args.port), Health)
print(f"tiny engine listening on {args.host}:{args.port}, loading weights...", flush=True)
if args.exit_after is not None:
    threading.Timer(args.exit_after, lambda: (print("tiny engine: crashing on purpose", flush=True), os._exit(3))).start()
server.serve_forever()
