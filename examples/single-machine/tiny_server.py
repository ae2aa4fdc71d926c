#!/usr/bin/env python3
"""A tiny OpenAI-shaped server for `engine: command` (stdlib only, no model, no GPU).

    python3 tiny_server.py --host 127.0.0.1 --port 9000 --model tiny

GET /health answers 200 once listening; GET /v1/models lists the one model;
POST /v1/completions echoes the prompt back. It exists so the single-machine
example reconciles something real on any laptop; SIGTERM stops it cleanly.
"""

import argparse
import json
import signal
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def make_handler(model: str):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):
            sys.stdout.write("%s %s\n" % (self.address_string(), fmt % args))
            sys.stdout.flush()

        def send_json(self, code: int, body: dict) -> None:
            raw = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self):
            path = self.path.split("?", 1)[0]
            if path == "/health":
                self.send_json(200, {"status": "ok"})
            elif path == "/v1/models":
                self.send_json(200, {"object": "list", "data": [{"id": model, "object": "model", "owned_by": "tiny"}]})
            else:
                self.send_json(404, {"error": "not found"})

        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b"{}"
            if self.path.split("?", 1)[0] != "/v1/completions":
                self.send_json(404, {"error": "not found"})
                return
            try:
                request = json.loads(raw or b"{}")
            except ValueError:
                self.send_json(400, {"error": "body is not JSON"})
                return
            prompt = request.get("prompt", "") if isinstance(request, dict) else ""
            if isinstance(prompt, list):
                prompt = " ".join(str(p) for p in prompt)
            self.send_json(200, {
                "id": "cmpl-tiny",
                "object": "text_completion",
                "model": model,
                "choices": [{"index": 0, "text": f"echo: {prompt}", "finish_reason": "stop", "logprobs": None}],
                "usage": {"prompt_tokens": len(str(prompt).split()), "completion_tokens": 0,
                          "total_tokens": len(str(prompt).split())},
            })

    return Handler


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", default="tiny")
    args = p.parse_args()

    server_cls = type("Server", (ThreadingHTTPServer,), {
        "address_family": socket.AF_INET6 if ":" in args.host else socket.AF_INET,
        "daemon_threads": True,
    })
    try:
        server = server_cls((args.host, args.port), make_handler(args.model))
    except OSError as exc:
        print(f"tiny_server: cannot listen on {args.host}:{args.port}: {exc.strerror}", file=sys.stderr)
        return 1
    # serve_forever runs in a thread so the SIGTERM handler can call shutdown() without deadlock.
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    print(f"tiny_server: serving {args.model} on http://{args.host}:{args.port}", flush=True)
    stop.wait()
    server.shutdown()
    server.server_close()
    print("tiny_server: stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
