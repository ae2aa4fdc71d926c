"""Serving the dashboard: uvicorn on a socket bound here, in the foreground or on a thread.

The socket is bound before uvicorn starts, so an address in use is a clear error at
once (not a log line from a thread), and port 0 tells its real port.
"""

from __future__ import annotations

import logging
import socket
import threading
from pathlib import Path

import uvicorn

import ipaddress

from reconciler.dashboard.app import create_app, loopback_hosts
from reconciler.errors import ReconcilerError, UsageError

log = logging.getLogger("reconciler.dashboard")
DEFAULT_ADDRESS = "127.0.0.1:8765"  # loopback unless told otherwise: the pages say everything about the fleet
H11_MAX_EVENT_BYTES = 64 * 1024  # under it, the guard's plain 414 answers an overlong URL
REFRESH_S = 0.25  # how often the refresher looks at status/ (a stat per file; a parse only of what changed)


def parse_address(text: str, flag: str = "--address") -> tuple[str, int]:
    """HOST:PORT or [V6]:PORT -> (host, port). No host means loopback, never every interface."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise UsageError(f"{flag} {text!r}: expected HOST:PORT, e.g. {DEFAULT_ADDRESS}")
    return host.strip("[]") or "127.0.0.1", int(port)


def bind(address: str, flag: str = "--address") -> socket.socket:
    host, port = parse_address(address, flag)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ReconcilerError(f"cannot serve the dashboard on {address}: {exc.strerror or exc}") from exc
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class DashboardServer:
    """The dashboard of one catalog on one address. start()/stop() run it on a daemon thread
    (beside the daemon's loop, as its metrics are); serve() runs it here until a signal."""

    def __init__(self, catalog: str | Path, address: str = DEFAULT_ADDRESS, flag: str = "--address"):
        self.catalog = Path(catalog)
        self._socket = bind(address, flag)
        host, port = self.address
        self.app = create_app(self.catalog, live=True, hosts=loopback_hosts(port) if _loopback(host) else None)
        config = uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="off",
                                server_header=False, date_header=False, h11_max_incomplete_event_size=H11_MAX_EVENT_BYTES,
                                timeout_graceful_shutdown=2)
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()
        self._refresher = threading.Thread(target=self._refresh, name="dashboard-refresh", daemon=True)

    def _refresh(self) -> None:
        """Reads status/ ahead of the pages: a pass's new files are parsed here, not in a request."""
        while not self._stopped.is_set():
            try:
                self.app.reader.refresh()
            except Exception:  # noqa: BLE001 - the pages keep the last snapshot; the log says why
                log.exception("dashboard: reading %s/status failed", self.catalog)
            self._stopped.wait(REFRESH_S)

    @property
    def loopback(self) -> bool:
        return _loopback(self.address[0])

    @property
    def address(self) -> tuple[str, int]:
        return self._socket.getsockname()[:2]

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{'[' + host + ']' if ':' in host else host}:{port}/"

    def serve(self) -> None:
        """In the foreground: uvicorn handles SIGINT and SIGTERM (the main thread's)."""
        self._refresher.start()
        try:
            self._server.run(sockets=[self._socket])
        finally:
            self._stopped.set()
            self._socket.close()

    def start(self) -> None:
        self._refresher.start()
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]},
                                        name="dashboard", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._socket.close()
