"""save_memory does not render an unchanged memory again, and never lets that skip lose a change."""

from __future__ import annotations

import json

from reconciler.record import memory as memory_module
from reconciler.record.memory import PassMemory, load_memory, save_memory


def test_an_equal_memory_is_not_rendered_or_written_again(tmp_path, monkeypatch):
    path = tmp_path / "memory.json"
    save_memory(path, PassMemory(unreachable_since={"g2": 100.0}))
    before = path.stat().st_mtime_ns
    rendered = []
    real = memory_module.memory_to_document
    monkeypatch.setattr(memory_module, "memory_to_document", lambda m: rendered.append(m) or real(m))
    save_memory(path, PassMemory(unreachable_since={"g2": 100.0}))
    assert rendered == []  # an equal memory: the JSON from last time
    assert path.stat().st_mtime_ns == before


def test_a_changed_memory_is_written_even_when_its_mapping_was_changed_in_place(tmp_path):
    path = tmp_path / "memory.json"
    since = {"g2": 100.0}
    memory = PassMemory(unreachable_since=since)
    save_memory(path, memory)
    since["g3"] = 200.0  # the same dict, changed after the save
    save_memory(path, memory)
    assert load_memory(path).unreachable_since == {"g2": 100.0, "g3": 200.0}


def test_a_memory_file_removed_under_the_daemon_is_written_again(tmp_path):
    path = tmp_path / "memory.json"
    save_memory(path, PassMemory(unreachable_since={"g2": 100.0}))
    path.unlink()
    save_memory(path, PassMemory(unreachable_since={"g2": 100.0}))
    assert json.loads(path.read_text())["unreachable_since"] == {"g2": 100.0}
