#!/usr/bin/env python3
"""A small real engine that speaks the OpenAI chat API as llama-server does, for gateway tests (stdlib only).

    chat_engine.py --port P [--host H] [--chunks N] [--chunk-s S] [--name NAME]

GET /health answers 200; GET /v1/models lists NAME; GET /metrics reports `chat:requests_running`
and `chat:requests_waiting` (waiting is always 0) counted from the requests in flight.
POST /v1/chat/completions answers a chat completion whose content names this engine's port; with
"stream": true, N chunks as server-sent events S seconds apart, then `data: [DONE]`, as OpenAI
servers do. A stream cut short shows as a missing [DONE] on the client's side.
"""
import argparse
import json
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

p = argparse.ArgumentParser()
p.add_argument("--host", default="127.0.0.1")
p.add_argument("--port", type=int, required=True)
p.add_argument("--chunks", type=int, default=8)
p.add_argument("--chunk-s", type=float, default=0.05)
p.add_argument("--name", default="chat")
args, _extra = p.parse_known_args()

lock = threading.Lock()
running = [0]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def _send(self, code, body, ctype="application/json"):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        path = self.path.split("?", 1)[0]
        if path == "/health":
            self._send(200, b'{"status":"ok"}')
        elif path == "/metrics":
            text = f"# TYPE chat:requests_running gauge\nchat:requests_running {running[0]}\n" \
                   "# TYPE chat:requests_waiting gauge\nchat:requests_waiting 0\n"
            self._send(200, text.encode(), "text/plain; version=0.0.4")
        elif path == "/v1/models":
            self._send(200, json.dumps({"object": "list", "data": [{"id": args.name, "object": "model"}]}).encode())
        else:
            self._send(404, b'{"detail":"Not Found"}')

    def do_POST(self):
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path.split("?", 1)[0] != "/v1/chat/completions":
            self._send(404, b'{"detail":"Not Found"}')
            return
        try:
            req = json.loads(raw or b"{}")
        except ValueError:
            self._send(400, b'{"error":"invalid JSON"}')
            return
        with lock:
            running[0] += 1
        try:
            self._answer(req)
        finally:
            with lock:
                running[0] -= 1

    def _answer(self, req):
        created, model, word = int(time.time()), req.get("model", args.name), f"port{args.port}"
        if not req.get("stream"):
            time.sleep(args.chunk_s)
            body = {"id": "chatcmpl-1", "object": "chat.completion", "created": created, "model": model,
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": word}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
            self._send(200, json.dumps(body).encode())
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def event(doc):
            data = b"data: " + (doc if isinstance(doc, bytes) else json.dumps(doc).encode()) + b"\n\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        for i in range(args.chunks):
            time.sleep(args.chunk_s)
            last = i == args.chunks - 1
            event({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": created, "model": model,
                   "choices": [{"index": 0, "delta": {"content": f"{word} "}, "finish_reason": "stop" if last else None}]})
        event(b"[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


server = ThreadingHTTPServer((args.host, args.port), Handler)
server.daemon_threads = True
signal.signal(signal.SIGTERM, lambda *a: (server.server_close(), sys.exit(0)))
print(f"chat engine on {args.host}:{args.port}", flush=True)
server.serve_forever(poll_interval=0.1)
