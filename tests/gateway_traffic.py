"""Traffic through a gateway the whole time, every answer checked (tests/test_gateway_handoff.py and
bench/handoff.py): client threads, each on one keep-alive connection as an OpenAI client holds it,
alternate a plain chat completion and a streamed one. A request fails when it is refused, answers
anything but 200, or breaks; a stream is cut when it ends without `data: [DONE]`."""

from __future__ import annotations

import http.client
import json
import threading
import time


class Traffic:
    def __init__(self, address: str, key: str, model: str, *, clients: int = 2, pause_s: float = 0.0):
        host, _, port = address.rpartition(":")
        self.host, self.port, self.key, self.model = host, int(port), key, model
        self.clients, self.pause_s = clients, pause_s
        self.sent = self.ok = self.streamed = 0
        self.failed: list[str] = []
        self.cut: list[str] = []
        self.latencies: list[tuple[bool, float]] = []  # (streamed, seconds to the last byte)
        self.served_by: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(clients)]

    def start(self) -> "Traffic":
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=120)

    def _run(self, index: int) -> None:
        conn = None
        n = index
        while not self._stop.is_set():
            stream = n % 2 == 1
            n += 1
            if conn is None:
                conn = http.client.HTTPConnection(self.host, self.port, timeout=120)
            began = time.monotonic()
            try:
                outcome, where = self._one(conn, stream)
            except (OSError, http.client.HTTPException) as exc:
                outcome, where = f"failed: {type(exc).__name__}: {exc}", ""
                conn.close()
                conn = None
            with self._lock:
                self.sent += 1
                self.streamed += stream
                if outcome == "ok":
                    self.ok += 1
                    self.latencies.append((stream, time.monotonic() - began))
                    self.served_by[where] = self.served_by.get(where, 0) + 1
                elif outcome.startswith("cut"):
                    self.cut.append(outcome)
                else:
                    self.failed.append(outcome)
            if self.pause_s:
                time.sleep(self.pause_s)

    def _one(self, conn: http.client.HTTPConnection, stream: bool) -> tuple[str, str]:
        body = json.dumps({"model": self.model, "messages": [{"role": "user", "content": "hi"}],
                           "max_tokens": 8, "stream": stream}).encode()
        conn.request("POST", "/v1/chat/completions", body=body,
                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.key}"})
        resp = conn.getresponse()
        where = resp.getheader("x-litellm-model-id") or ""
        if resp.status != 200:
            return f"failed: HTTP {resp.status}: {resp.read()[:300]!r}", where
        if not stream:
            doc = json.loads(resp.read())
            return ("ok" if doc.get("choices") else f"failed: no choices: {doc!r}"[:300]), where
        done = False
        for raw in resp:
            line = raw.strip()
            if line == b"data: [DONE]":
                done = True
        return ("ok" if done else "cut: the stream ended without [DONE]"), where


def p95(values: list[float]) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]
