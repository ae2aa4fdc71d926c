"""Who a catalog's processes and jobs belong to (SPEC section 7, Ownership).

One place, so every launcher and every record asks the same question the same way:
fleet.yaml `owner:` when set, else derived from the catalog repository: its first
(root) commit id, which every clone of the repository shares and no other repository
has. A catalog that is not a git repository gets a digest of its absolute path
(stable on that machine, which is all such a catalog has).
"""

from __future__ import annotations

import hashlib
import subprocess
from functools import lru_cache
from pathlib import Path

from reconciler.model import Catalog

OWNER_LENGTH = 12


def catalog_owner(catalog: Catalog) -> str:
    if catalog.fleet.owner:
        return catalog.fleet.owner
    return derived_owner(str(catalog.root))


@lru_cache(maxsize=64)
def derived_owner(root: str) -> str:
    try:
        out = subprocess.run(["git", "-C", root, "rev-list", "--max-parents=0", "HEAD"],
                             capture_output=True, text=True, timeout=10)
        roots = sorted(out.stdout.split()) if out.returncode == 0 else []
    except (OSError, subprocess.TimeoutExpired):
        roots = []
    if roots:
        return roots[0][:OWNER_LENGTH]  # several roots (merged histories): the same one on every clone
    return hashlib.sha256(str(Path(root).resolve()).encode()).hexdigest()[:OWNER_LENGTH]
