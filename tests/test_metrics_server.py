"""The daemon's /metrics server (reconciler.record.metrics.MetricsServer), on loopback: a scraper that hangs
up mid-request leaves no traceback on the daemon's stderr, and the next scrape is answered."""

from __future__ import annotations

import socket
import struct
import time
import urllib.request

from reconciler.record.metrics import Metrics, MetricsServer


def test_a_scraper_that_resets_its_connection_leaves_no_traceback_and_the_next_scrape_is_served(capfd):
    server = MetricsServer(Metrics(), "127.0.0.1:0")
    server.start()
    try:
        host, port = server.address
        for _ in range(3):
            s = socket.create_connection((host, port), timeout=5)
            s.sendall(b"GET /metrics HTTP/1.1\r\n")  # half a request, then a reset (SO_LINGER 0)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()
        time.sleep(0.5)  # the handler threads meet the resets
        body = urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10).read().decode()
    finally:
        server.stop()
    assert "# TYPE reconciler_passes_total counter" in body
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Exception occurred" not in err, err
