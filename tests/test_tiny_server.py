"""The example's stand-in server answers a body it cannot use with 400, and goes on serving."""

from __future__ import annotations

import http.client
import json
import threading
from http.server import ThreadingHTTPServer

import pytest

from reconciler.tiny_server import make_handler


@pytest.fixture
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), make_handler("tiny"))
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()
    thread.join(10)


def post(port: int, body: bytes, length: str | None = None) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.putrequest("POST", "/v1/completions")
    conn.putheader("Content-Length", length if length is not None else str(len(body)))
    conn.endheaders(body)
    resp = conn.getresponse()
    answer = resp.status, json.loads(resp.read())
    conn.close()
    return answer


@pytest.mark.parametrize("body,length", [
    (b"[" * 100_000 + b"]" * 100_000, None),  # JSON nested past json.loads' recursion
    (b'["a list"]', None),
    (b"{}", "ten"),
    (b"not json", None),
])
def test_a_body_it_cannot_use_is_a_400_and_the_server_goes_on(server, body, length):
    status, answer = post(server, body, length)
    assert status == 400 and "error" in answer
    status, answer = post(server, json.dumps({"prompt": "abc"}).encode())
    assert status == 200 and answer["choices"][0]["text"] == "cba"
