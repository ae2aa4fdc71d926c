"""The dashboard's ASGI app: Starlette routes over StatusFiles, pages rendered by Jinja2.

Starlette and uvicorn: a small, well-kept ASGI stack (routing, static files with path
checks, HEAD for every GET, a test client) that runs in a thread beside the daemon's
loop without an event loop of the daemon's own; Jinja2 escapes everything by default,
and node names, reasons and messages come from machines and people.

Read-only by construction: the guard in front of the app answers 405 to every method
but GET and HEAD, 414 to an overlong URL, and 500 in plain text (never a traceback) to
anything that went wrong inside; every answer carries a Content-Security-Policy that
allows only the dashboard's own scripts and styles, and no page has a form.
"""

from __future__ import annotations

import contextlib
import gc
import json
import threading
import logging
import time
from pathlib import Path
from typing import Any

import yaml

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from reconciler.record.status_view import StatusUnreadable, status_report_from_documents, json_document, message_text, nodes_text
from reconciler.dashboard.cells import GPU_USES
from reconciler.dashboard.charts import DAY_S, history_charts, svg
from reconciler.dashboard.files import StatusFiles, StatusSnapshot
from reconciler.dashboard.filters import Filters
from reconciler.dashboard.fleet import fleet_view
from reconciler.dashboard.index import Index, build_index
from reconciler.dashboard.models import models_view
from reconciler.dashboard.overview import overview as overview_of
from reconciler.dashboard.rejections import rejection_groups
from reconciler.errors import UsageError
from reconciler.record.eventlog import EventJournal, SampleRing
from reconciler.record.events import EventFilter, event_line, parse_kind, parse_since, to_document
from reconciler.vocabulary import NodeState, Phase

log = logging.getLogger("reconciler.dashboard")

MAX_URL_BYTES = 4096  # a longer path or query string is 414: no page needs one
FRAGMENT_HEADER = "x-dashboard-fragment"  # the page's script asks for the content alone
STATIC = Path(__file__).parent / "static"
SECURITY_HEADERS = [
    (b"content-security-policy", b"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
                                 b"connect-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
]


class Guard:
    """In front of everything: the methods, the URL's length, the headers, and no traceback out.

    hosts: the Host values answered (None: any). On loopback only loopback names are: a web page
    elsewhere that points its own name at 127.0.0.1 (DNS rebinding) gets nothing from the fleet."""

    def __init__(self, app, hosts: frozenset[str] | None = None):
        self.app = app
        self.hosts = hosts

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            return await self.app(scope, receive, send)
        if scope["type"] != "http":  # websockets: nothing here speaks them
            return
        send_with_headers = _SendWithHeaders(send)
        refusal = self._refusal(scope)
        if refusal is not None:
            return await _plain(send_with_headers, *refusal)
        await self._answer(scope, receive, send_with_headers)

    def _refusal(self, scope) -> tuple[int, str, list | None] | None:
        """(status, text, headers) of the answer a request gets without reaching the app; None: it reaches it."""
        if scope["method"] not in ("GET", "HEAD"):
            return 405, ("405 Method Not Allowed: this dashboard is read-only; "
                         "change the catalog through git\n"), [(b"allow", b"GET, HEAD")]
        if len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"") > MAX_URL_BYTES:
            return 414, "414 URI Too Long\n", None
        if self.hosts is not None and _host(scope) not in self.hosts:
            return 421, "421 Misdirected Request: this dashboard answers to its loopback address only\n", None
        return None

    async def _answer(self, scope, receive, send: "_SendWithHeaders") -> None:
        try:
            await self.app(scope, receive, send)
        except Exception:  # noqa: BLE001 - the reader gets one plain line; the log gets the traceback
            log.exception("dashboard: error answering %s", scope.get("path"))
            if not send.started:
                await _plain(send, 500, "500 Internal Server Error\n")


def _host(scope) -> str:
    return dict(scope.get("headers") or []).get(b"host", b"").decode("latin-1").lower()


class _SendWithHeaders:
    """An ASGI send that puts SECURITY_HEADERS on every response (in place of any the app set) and
    knows whether a response has started."""

    def __init__(self, send):
        self.send = send
        self.started = False

    async def __call__(self, message):
        if message["type"] == "http.response.start":
            self.started = True
            headers = [(k, v) for k, v in message.get("headers", []) if k.lower() not in dict(SECURITY_HEADERS)]
            message = {**message, "headers": headers + SECURITY_HEADERS}
        await self.send(message)


async def _plain(send, status: int, text: str, headers: list | None = None) -> None:
    body = text.encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode()),
        *(headers or [])]})
    await send({"type": "http.response.body", "body": body})


def _environment() -> Environment:
    env = Environment(loader=PackageLoader("reconciler.dashboard", "templates"),
                      autoescape=select_autoescape(default=True, default_for_string=True))
    env.globals.update(Phase=Phase, NodeState=NodeState, GPU_USES=GPU_USES, nodes_text=nodes_text,
                       message_text=message_text, short=lambda r: (r or "")[:12])
    env.filters["when"] = lambda t: time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t)) if t else "never"
    env.filters["plural"] = lambda n, word: f"{n} {word}{'s' * (n != 1)}"
    return env


@contextlib.contextmanager
def _no_cyclic_gc():
    """Parsing 10 MB of status and indexing it builds millions of objects: with the cyclic collector
    on, its collections re-walk them all the while and take half the time (measured at 4,000 nodes:
    1.8 s of CPU, 1.0 s without). Reference counting still frees what is dropped; the collector runs
    again afterwards, as `plan` does at exit."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class Reader:
    """Where a request gets its snapshot of status/.

    Served by DashboardServer, a refresher thread calls refresh() twice a second and requests take
    the last snapshot it prepared: a pass that rewrote a 4,000-node nodes.yaml is parsed there, and
    no request waits for it (the pages show the new files once they are parsed, within the 2 s the
    pages promise). Without a refresher (live=False: the tests' TestClient) each request reads."""

    def __init__(self, files: StatusFiles, live: bool = False):
        self.files, self.live = files, live
        self._prepared: tuple[StatusSnapshot, Index] | None = None
        self._refreshing = threading.Lock()  # one parse at a time: a request at start-up waits for the refresher's

    def refresh(self) -> tuple[StatusSnapshot, Index]:
        with self._refreshing, _no_cyclic_gc():
            snap = self.files.snapshot()
            previous = self._prepared[1] if self._prepared is not None else None
            prepared = (snap, self.files.derived("index", snap, lambda s: build_index(s, previous)))
        self._prepared = prepared  # one reference: a request sees one snapshot and its index, never a mix
        return prepared

    def current(self) -> tuple[StatusSnapshot, Index]:
        prepared = self._prepared
        return prepared if self.live and prepared is not None else self.refresh()


def loopback_hosts(port: int) -> frozenset[str]:
    """The Host values a browser sends to a dashboard on loopback port `port`."""
    names = ("127.0.0.1", "localhost", "[::1]")
    return frozenset([*names, *(f"{n}:{port}" for n in names)])


def create_app(catalog: str | Path, files: StatusFiles | None = None, live: bool = False,
               hosts: frozenset[str] | None = None) -> Guard:
    """The dashboard of one catalog directory, as an ASGI app (live: see Reader; hosts: see Guard)."""
    files = files or StatusFiles(catalog)
    reader = Reader(files, live)
    # The event log and history the daemon keeps for this catalog (out of git, beside its memory).
    journal = EventJournal.for_catalog(files.root)
    samples = SampleRing(journal.directory)
    env = _environment()

    def page(request: Request, template: str, title: str, snap: StatusSnapshot, **context: Any) -> Response:
        context |= {"snap": snap, "title": title, "request": request, "path": request.url.path,
                    "catalog": str(files.root), "now": time.time()}
        content = env.get_template(template).render(context)
        headers = {"x-dashboard-version": snap.version}
        if request.headers.get(FRAGMENT_HEADER) == "1":
            return HTMLResponse(content, headers=headers)
        return HTMLResponse(env.get_template("layout.html").render(context | {"content": content}), headers=headers)

    def filters(request: Request) -> Filters:
        return Filters.from_query(request.query_params, request.query_params.getlist("label"))

    def overview(request: Request) -> Response:
        snap, ix = reader.current()
        o = files.derived("overview", snap, lambda s: overview_of(s, ix))
        return page(request, "overview.html", "Overview", snap, o=o, ix=ix)

    def models(request: Request) -> Response:
        snap, ix = reader.current()
        f = filters(request)
        return page(request, "models.html", "Models", snap, models=models_view(snap, ix, f), f=f, ix=ix)

    def fleet(request: Request) -> Response:
        snap, ix = reader.current()
        f = filters(request)
        return page(request, "fleet.html", "Fleet", snap, fleet=fleet_view(ix, f), f=f, ix=ix)

    def replica(request: Request) -> Response:
        snap, ix = reader.current()
        rep = ix.replicas.get(request.path_params["replica"])
        if rep is None:
            return PlainTextResponse("404 Not Found: no such replica in status/models/\n", status_code=404)
        groups = rejection_groups(rep.doc, show_all=True)
        shared = [r.id for r in ix.replicas.values() if r.doc.get("rejections_same_as") == rep.id]
        entry = yaml.safe_dump({k: v for k, v in rep.doc.items() if k != "rejections"}, sort_keys=False,
                               allow_unicode=True)  # the rejections are shown grouped above it
        return page(request, "replica.html", rep.id, snap, rep=rep, groups=groups, shared=shared, ix=ix, entry=entry)

    def history(request: Request) -> Response:
        snap, _ = reader.current()
        now = time.time()
        model = request.query_params.get("model") or None
        kept = samples.read(since=now - DAY_S)
        events, skipped = journal.read(EventFilter(since=now - DAY_S, model=model))
        charts = [svg(c) for c in history_charts(kept, events, now, model)]
        names = sorted(kept[-1].models) if kept else []
        return page(request, "history.html", "History" + (f": {model}" if model else ""), snap, charts=charts,
                    model=model, names=names, samples=len(kept), events=[event_line(e) for e in events[-200:][::-1]],
                    skipped=[str(x) for x in skipped])

    def api_events(request: Request) -> Response:
        q = request.query_params
        try:
            keep = EventFilter(since=parse_since(q["since"], time.time()) if q.get("since") else None,
                               model=q.get("model") or None, node=q.get("node") or None,
                               kind=parse_kind(q["kind"]) if q.get("kind") else None)
        except UsageError as exc:  # the same words as `reconciler events`, with the parameter's name
            return PlainTextResponse(f"400 Bad Request: {str(exc).lstrip('-')}\n", status_code=400)
        events, skipped = journal.read(keep)
        return Response(json.dumps({"events": [to_document(e) for e in events],
                                    "skipped": [str(x) for x in skipped]}), media_type="application/json")

    def status_json(snap: StatusSnapshot) -> bytes:
        try:
            status = status_report_from_documents(
                files.root, snap.catalog.doc or {},
                [(files.root / r.rel, r.doc) for r in snap.models if r.doc is not None])
        except StatusUnreadable:  # a catalog.yaml that was never good: no revision to tell
            status = status_report_from_documents(files.root, {}, [
                (files.root / r.rel, r.doc) for r in snap.models if r.doc is not None])
        return (json.dumps(json_document(status), indent=2) + "\n").encode()

    def api_status(request: Request) -> Response:
        snap, _ = reader.current()
        return Response(files.derived("status.json", snap, status_json), media_type="application/json")

    def api_nodes(request: Request) -> Response:
        snap, _ = reader.current()
        body = files.derived("nodes.json", snap, lambda s: json.dumps(s.nodes.doc or {"nodes": []}).encode())
        return Response(body, media_type="application/json")

    def api_version(request: Request) -> Response:
        snap, _ = reader.current()
        return Response(json.dumps({"version": snap.version, "updated": snap.updated, "now": time.time(),
                                    "problems": snap.problems}), media_type="application/json")

    app = Starlette(routes=[
        Route("/", overview, methods=["GET"]),
        Route("/models", models, methods=["GET"]),
        Route("/fleet", fleet, methods=["GET"]),
        Route("/replicas/{replica}", replica, methods=["GET"]),
        Route("/history", history, methods=["GET"]),
        Route("/api/events", api_events, methods=["GET"]),
        Route("/api/status", api_status, methods=["GET"]),
        Route("/api/nodes", api_nodes, methods=["GET"]),
        Route("/api/version", api_version, methods=["GET"]),
        Mount("/static", app=StaticFiles(directory=STATIC, follow_symlink=False), name="static"),
    ])
    guard = Guard(app, hosts)
    guard.reader = reader
    return guard
