"""What the URL narrows a page to, and which rows of a long page it shows (pure)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

PAGE_SIZE = 100  # nodes per fleet page; ?per= up to MAX_PAGE_SIZE
MODELS_PAGE_SIZE = 25  # models per models page
MAX_PAGE_SIZE = 1000


@dataclass(frozen=True)
class Filters:
    """What the URL narrows a page to: ?model=&label=k=v&phase=&state=&gpu=&node=&page=&per=."""

    model: str = ""
    labels: tuple[tuple[str, str], ...] = ()
    phase: str = ""
    state: str = ""  # node state
    gpu: str = ""  # a GpuUse: nodes with at least one such GPU
    node: str = ""  # part of a node id
    unplaced: bool = False  # replicas no node could take
    page: int = 1
    per: int | None = None  # rows a page shows; None: the page's own default

    @classmethod
    def from_query(cls, params: Mapping[str, str], labels: Iterable[str]) -> "Filters":
        return cls(
            model=params.get("model", "").strip(), labels=_label_pairs(labels), phase=params.get("phase", "").strip(),
            state=params.get("state", "").strip(), gpu=params.get("gpu", "").strip(),
            node=params.get("node", "").strip(), unplaced=params.get("unplaced", "") not in ("", "0"),
            page=_int(params.get("page"), 1, 1, 10**6),
            per=_int(params.get("per"), None, 1, MAX_PAGE_SIZE),
        )

    @property
    def active(self) -> bool:
        return bool(self.model or self.labels or self.phase or self.state or self.gpu or self.node or self.unplaced)

    def label_text(self) -> list[str]:
        return [f"{k}={v}" for k, v in self.labels]

    def node_matches(self, node: dict) -> bool:
        labels = node.get("labels") if isinstance(node.get("labels"), dict) else {}
        return all(str(labels.get(k, "\0")) == v for k, v in self.labels)


def _label_pairs(labels: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """Each ?label=k=v as (k, v); a bare ?label=k is (k, ""), one with no key is dropped."""
    pairs = []
    for text in labels:
        key, sep, value = text.partition("=")
        if key.strip():
            pairs.append((key.strip(), value.strip() if sep else ""))
    return tuple(pairs)


def _int(text: str | None, default: int | None, low: int, high: int) -> int | None:
    try:
        return min(max(int(text), low), high) if text is not None else default
    except ValueError:
        return default


def page_window(count: int, requested: int, per: int) -> tuple[int, int, int]:
    """(page shown, pages, index of its first row) of `count` rows, `per` a page: past the last page is the last."""
    pages = max(1, -(-count // per))
    page = min(requested, pages)
    return page, pages, (page - 1) * per
