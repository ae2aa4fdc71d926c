"""The event log and the history samples on disk (SPEC section 15): kept by the daemon (and `apply`)
out of git, beside the pass memory, bounded in size and rotated.

Both are JSON lines, not SQLite: one append per pass is one write(2) of whole lines, which a reader
(`reconciler events --follow`, the dashboard) can read at any moment without a lock or a second
writer's journal; a write torn by a crash or a full disk costs that one line, which the reader skips
and counts, and never the file; rotation is a rename; and an operator can read the file with `tail`
and `jq`. What SQLite would add (queries, indexes) is not needed for a log read front to back,
bounded to a few megabytes.

Each file is kept under `max_bytes`: past it, it is renamed to `<name>.1` (the one before is
dropped), so a log never takes more than twice that.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Iterable, Iterator

from reconciler.errors import StatusWriteError, parse_json
from reconciler.record.events import Event, EventFilter, Seen, Skipped, read_events, seen_from_document, seen_to_document, \
    to_document
from reconciler.record.history import KEYFRAME_EVERY, Sample, read_samples, sample_to_document
from reconciler.record.memory import memory_path
from reconciler.record.status.files import write_rendered

EVENTS_FILE, SAMPLES_FILE, SEEN_FILE = "events.jsonl", "samples.jsonl", "seen.json"
# 8 MiB of events is some 40,000 events (a busy week of a 4,000-node fleet); the samples of a day of
# passes every 30 s at 10,000 replicas fit 2 x 32 MiB (bench/simfleet.py --events prints both).
EVENTS_MAX_BYTES = 8 << 20
SAMPLES_MAX_BYTES = 32 << 20


def log_dir(catalog_root: str | os.PathLike) -> Path:
    """Where the daemon and `apply` keep a catalog's events and history: beside the pass memory, on
    this management host, per catalog, outside the catalog (not desired state, never in `git status`)."""
    memory = memory_path(str(catalog_root))
    return memory.parent.parent / "events" / memory.stem


class RotatingLines:
    """A JSON-lines file kept under max_bytes by renaming it to <name>.1 once it is past that."""

    def __init__(self, path: Path, max_bytes: int):
        self.path, self.max_bytes = Path(path), max_bytes

    @property
    def older(self) -> Path:
        return self.path.with_name(self.path.name + ".1")

    def append(self, lines: Iterable[str]) -> None:
        text = "".join(line + "\n" for line in lines)
        if not text:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(text)  # whole lines in one write: a reader never sees half of a pass's lines but the last
                size = f.tell()
            if size > self.max_bytes:
                os.replace(self.path, self.older)
        except OSError as exc:
            raise StatusWriteError(self.path, exc.strerror or str(exc)) from exc

    def files(self) -> list[Path]:
        """The files, oldest first (the rotated one, then the current one), those that exist."""
        return [p for p in (self.older, self.path) if p.exists()]


def _read_lines(path: Path) -> list[bytes]:
    return _read_with_position(path)[0]


def _read_with_position(path: Path) -> tuple[list[bytes], tuple[int | None, int]]:
    """The file's whole lines, and (inode, offset) just past them: where a follower goes on from."""
    try:
        with open(path, "rb") as f:
            data = f.read()
            inode = os.fstat(f.fileno()).st_ino
    except OSError:  # rotated away between listing and reading: its lines are in the next file
        return [], (None, 0)
    whole = data[:data.rfind(b"\n") + 1]  # a torn last line is read by the follower once it is whole
    return data.splitlines(), (inode, len(whole))


class EventJournal:
    """A catalog's event log: append a pass's events, read them back filtered, follow new ones."""

    def __init__(self, directory: str | os.PathLike, max_bytes: int = EVENTS_MAX_BYTES):
        self.directory = Path(directory)
        self.events = RotatingLines(self.directory / EVENTS_FILE, max_bytes)

    @classmethod
    def for_catalog(cls, catalog_root: str | os.PathLike) -> "EventJournal":
        return cls(log_dir(catalog_root))

    def append(self, events: Iterable[Event]) -> None:
        self.events.append(json.dumps(to_document(e), ensure_ascii=False) for e in events)

    def read(self, keep: EventFilter | None = None) -> tuple[list[Event], list[Skipped]]:
        """Every event kept, oldest first, and what could not be read in each file."""
        events, skipped, _ = self.read_from(keep)
        return events, skipped

    def read_from(self, keep: EventFilter | None = None
                  ) -> tuple[list[Event], list[Skipped], tuple[int | None, int]]:
        """read(), and where the current file ended: `follow(at=...)` goes on from there, so an event
        written in between is neither lost nor shown twice."""
        keep = keep or EventFilter()
        out, skipped, at = [], [], (None, 0)
        for path in self.events.files():
            lines, position = _read_with_position(path)
            if path == self.events.path:
                at = position
            events, bad = read_events(str(path), lines, keep)
            out += events
            if bad is not None:
                skipped.append(bad)
        out.sort(key=lambda e: e.time)  # stable: a pass's own order is kept
        return out, skipped, at

    def follow(self, keep: EventFilter | None = None, poll_s: float = 0.5, sleep=time.sleep,
               at: tuple[int | None, int] | None = None) -> Iterator[Event | Skipped]:
        """New events as they are written, until the caller stops (Ctrl-C): from `at` (read_from's;
        default: the end of the file now), from a file's start again once rotated (a new inode), a
        torn last line waited for until it is whole."""
        path = self.events.path
        return self._follow(keep or EventFilter(), path, at if at is not None else _position(path), poll_s, sleep)

    def _follow(self, keep, path, at, poll_s, sleep) -> Iterator[Event | Skipped]:
        inode, offset = at
        pending = b""
        while True:
            now_inode, size = _position(path)
            if now_inode != inode or size < offset:  # rotated (or truncated): the new file from its start
                inode, offset, pending = now_inode, 0, b""
            if size > offset:
                try:
                    with open(path, "rb") as f:
                        f.seek(offset)
                        chunk = f.read(size - offset)
                except OSError:
                    chunk = b""
                offset += len(chunk)
                pending += chunk
                *whole, pending = pending.split(b"\n")
                events, bad = read_events(str(path), whole, keep)
                yield from events
                if bad is not None:
                    yield bad
            sleep(poll_s)

    def load_seen(self) -> Seen | None:
        try:
            return seen_from_document(parse_json((self.directory / SEEN_FILE).read_text()))
        except (OSError, ValueError):
            return None

    def save_seen(self, seen: Seen) -> None:
        write_rendered(self.directory / SEEN_FILE, seen, lambda: json.dumps(seen_to_document(seen), sort_keys=True))


def _position(path: Path) -> tuple[int | None, int]:
    try:
        st = path.stat()
    except OSError:
        return None, 0
    return st.st_ino, st.st_size


class SampleRing:
    """The history's samples, one per pass, bounded like the event log (the dashboard reads the last 24 h)."""

    def __init__(self, directory: str | os.PathLike, max_bytes: int = SAMPLES_MAX_BYTES):
        self.lines = RotatingLines(Path(directory) / SAMPLES_FILE, max_bytes)
        self._last: Sample | None = None  # what the next sample is written as a change from
        self._since_keyframe = 0

    @classmethod
    def for_catalog(cls, catalog_root: str | os.PathLike) -> "SampleRing":
        return cls(log_dir(catalog_root))

    def append(self, sample: Sample) -> None:
        """One pass's sample: whole the first time this process writes and every KEYFRAME_EVERY
        samples (and after a rotation, so each file starts whole), else as a change from the last."""
        rotated = not self.lines.path.exists()
        previous = None if rotated or self._since_keyframe >= KEYFRAME_EVERY else self._last
        self.lines.append([json.dumps(sample_to_document(sample, previous), separators=(",", ":"))])
        self._since_keyframe = 0 if previous is None else self._since_keyframe + 1
        self._last = sample

    def read(self, since: float | None = None) -> list[Sample]:
        out: list[Sample] = []
        carried: dict = {}  # the models as the older file left them: the newer file's first lines change them
        for path in self.lines.files():
            out += read_samples(_read_lines(path), since, carried)
        return out
