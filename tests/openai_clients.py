"""Clients of the OpenAI-compatible API that the engines (llama-server, vLLM) and LiteLLM serve, as the
tests and benches reach them: one request, one streamed completion read to its end, and a steady load.

Stdlib only (urllib), so what a test sees is what the server sent: no client library retries or
reconnects on its behalf. Traffic goes only where a test points it (loopback, or its own namespaces).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from typing import Callable


def post_json(url: str, body: dict, *, timeout: float = 300, headers: dict | None = None) -> dict:
    """POST `body` as JSON; the parsed answer. An HTTP error raises urllib.error.HTTPError."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.load(r)


def chat(endpoint: str, prompt: str = "Name one colour.", max_tokens: int = 8, timeout: float = 120, *,
         model: str | None = None, headers: dict | None = None) -> dict:
    """POST /v1/chat/completions, greedy; the parsed answer (usage, timings). `model`: the served name, for
    servers that check it (vLLM, LiteLLM); llama-server serves one model and takes none."""
    body: dict = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0}
    if model is not None:
        body = {"model": model, **body}
    return post_json(endpoint.rstrip("/") + "/v1/chat/completions", body, timeout=timeout, headers=headers)


class Stream(threading.Thread):
    """A long streamed chat completion (EOS ignored, so exactly `tokens` are generated) read to its end.

    After join(): `done` (the server's `data: [DONE]`), `finish_reason`, `chunks` (deltas with content),
    `error` (what cut it, if anything) and `ended_at` (wall time of its last byte). `started` is set at
    the first content, or at the end when there was none."""

    def __init__(self, endpoint: str, model: str, tokens: int, *, timeout: float = 900):
        super().__init__(daemon=True)
        self.endpoint, self.model, self.tokens, self.timeout = endpoint, model, tokens, timeout
        self.chunks = 0
        self.finish_reason: str | None = None
        self.done = False
        self.error: Exception | None = None
        self.started = threading.Event()
        self.ended_at: float | None = None

    def run(self) -> None:
        body = json.dumps({"model": self.model, "messages": [{"role": "user", "content": "Tell a long story."}],
                           "max_tokens": self.tokens, "ignore_eos": True, "stream": True}).encode()
        req = urllib.request.Request(self.endpoint.rstrip("/") + "/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                for raw in r:
                    line = raw.decode().strip()
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        self.done = True
                        break
                    for choice in json.loads(data).get("choices", []):
                        if choice.get("delta", {}).get("content"):
                            self.chunks += 1
                            self.started.set()
                        self.finish_reason = choice.get("finish_reason") or self.finish_reason
        except Exception as exc:  # noqa: BLE001 - a cut stream: the test's assertion says how
            self.error = exc
        finally:
            self.ended_at = time.time()
            self.started.set()


class Load:
    """`workers` threads, each calling `send()` (one request) after another until stop(); at most `limit`
    requests in all. Counts what was sent and answered, and keeps each error's repr."""

    def __init__(self, send: Callable[[], object], workers: int = 4, limit: int = 2000, join_s: float = 300):
        self.send, self.limit, self.join_s = send, limit, join_s
        self.sent, self.answered, self.errors = 0, 0, []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._work, daemon=True) for _ in range(workers)]
        for t in self._threads:
            t.start()

    def _work(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                if self.sent >= self.limit:
                    return
                self.sent += 1
            try:
                self.send()
                with self._lock:
                    self.answered += 1
            except (OSError, urllib.error.URLError, ValueError) as exc:
                with self._lock:
                    self.errors.append(repr(exc))

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=self.join_s)
