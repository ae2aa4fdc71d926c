"""A tiny stand-in inference server for the single-machine example (stdlib only).

It speaks the parts of the OpenAI-style HTTP surface that the reconciler and a
gateway touch: GET /health (200 once started), GET /v1/models, and POST
/v1/completions answering with an echo of the prompt. Run it through a
`command` profile:  python3 -m reconciler.tiny_server --port ${PORT} --model ${MODEL_SOURCE}
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def make_handler(model: str):
    in_flight = [0]
    counting = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        server_version = "tiny-llm/0.1"

        def _send(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # noqa: N802 - http.server's naming
            if self.path == "/health":
                self._send(200, {"status": "ok"})
            elif self.path == "/metrics":
                # Requests in flight, as an engine's /metrics says them (the example declares these
                # series): a replica the reconciler stops drains only while a completion runs.
                text = ("# TYPE tiny_requests_running gauge\ntiny_requests_running %d\n"
                        "# TYPE tiny_requests_waiting gauge\ntiny_requests_waiting 0\n" % in_flight[0]).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(text)))
                self.end_headers()
                self.wfile.write(text)
            elif self.path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": model, "object": "model", "owned_by": "tiny"}]})
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self):  # noqa: N802
            if self.path != "/v1/completions":
                self._send(404, {"error": "not found"})
                return
            with counting:
                in_flight[0] += 1
            try:
                self._complete()
            finally:
                with counting:
                    in_flight[0] -= 1

        def _complete(self) -> None:
            try:
                length = int(self.headers.get("Content-Length") or 0)
                req = json.loads(self.rfile.read(length) or b"{}")
            except (ValueError, RecursionError):  # a bad length, not JSON, or JSON nested past the stack
                self._send(400, {"error": "body is not JSON"})
                return
            if not isinstance(req, dict):
                self._send(400, {"error": "body is not a JSON object"})
                return
            prompt = str(req.get("prompt", ""))
            self._send(
                200,
                {
                    "id": f"cmpl-{int(time.time() * 1000)}",
                    "object": "text_completion",
                    "model": model,
                    "choices": [{"index": 0, "text": prompt[::-1], "finish_reason": "stop"}],
                },
            )

        def log_message(self, fmt, *args):  # one line per request on stderr, like an engine's access log
            sys.stderr.write("%s %s\n" % (self.address_string(), fmt % args))

    return Handler


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tiny_server")
    ap.add_argument("--host", default="0.0.0.0")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--model", default="tiny")
    args = ap.parse_args(argv)
    server = ThreadingHTTPServer((args.host, args.port), make_handler(args.model))

    def stop(signum, frame):  # SIGTERM ends serve_forever the same way Ctrl-C does
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    print(f"serving {args.model} on {args.host}:{args.port}", file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
