"""The shape of the package, checked on its import graph (grimp, what import-linter reads)."""

import ast
from pathlib import Path

import pytest

from tests.conftest import REPO


# The process tier, beside lint-imports (tests/test_architecture.py): grimp is import-linter's, a test
# dependency, and the fast tier needs nothing installed, not even at collection.
@pytest.mark.process
def test_no_module_imports_one_that_imports_it_back():
    import grimp

    graph = grimp.build_graph("reconciler", cache_dir=None)
    circles = sorted({
        tuple(sorted((module, imported)))
        for module in graph.modules
        for imported in graph.find_modules_directly_imported_by(module)
        if graph.chain_exists(importer=imported, imported=module)
    })
    assert circles == []


def test_the_package_map_names_every_module():
    doc = ast.get_docstring(ast.parse((REPO / "reconciler" / "__init__.py").read_text()))
    words = set(doc.replace(",", " ").replace("/", " ").replace("(", " ").replace(")", " ").split())
    missing = []
    for path in sorted((REPO / "reconciler").rglob("*.py")):
        name = path.stem
        if name in ("__init__", "__main__") or "parsers" in path.parts:
            continue
        if name not in words:
            missing.append(str(Path(path).relative_to(REPO)))
    assert missing == []
