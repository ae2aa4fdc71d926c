"""write_document skips re-representing an unchanged document, and never lets that skip hide a change."""

from __future__ import annotations

import yaml

from reconciler.record.status import files as status


def test_an_unchanged_document_is_not_dumped_again_and_not_rewritten(tmp_path, monkeypatch):
    path = tmp_path / "nodes.yaml"
    doc = {"nodes": [{"id": "a", "gpus": [0, 1]}]}
    assert status.write_document(path, doc) is True
    dumps = []
    real = status.dump_yaml
    monkeypatch.setattr(status, "dump_yaml", lambda d: dumps.append(d) or real(d))
    assert status.write_document(path, {"nodes": [{"id": "a", "gpus": [0, 1]}]}) is False
    assert dumps == []  # an equal document: the YAML from last time


def test_a_document_changed_in_place_after_writing_is_written_again(tmp_path):
    path = tmp_path / "nodes.yaml"
    doc = {"nodes": [{"id": "a", "state": "ready"}]}
    status.write_document(path, doc)
    doc["nodes"][0]["state"] = "unreachable"  # the caller's dict, reused
    assert status.write_document(path, doc) is True
    assert yaml.safe_load(path.read_text())["nodes"][0]["state"] == "unreachable"


def test_a_file_edited_under_the_reconciler_is_written_over(tmp_path):
    path = tmp_path / "nodes.yaml"
    doc = {"nodes": [{"id": "a"}]}
    status.write_document(path, doc)
    path.write_text("edited by hand\n")
    assert status.write_document(path, {"nodes": [{"id": "a"}]}) is True
    assert yaml.safe_load(path.read_text()) == doc
