"""`reconciler validate [CATALOG] [--inventory FILE]`."""

from __future__ import annotations

from reconciler.catalog import field_locator, load_catalog
from reconciler.constants import Exit
from reconciler.errors import CatalogInvalid


def main(args) -> int:
    catalog = load_catalog(args.catalog, with_revision=False)
    if args.inventory:
        # Models that no profile could ever fit on this fleet, even empty: better said
        # now than left Pending forever.
        from reconciler.commands._observe import check_inventory_path, load_snapshot
        from reconciler.decide.placement import unfittable_problems

        check_inventory_path(args.inventory)
        inventory = load_snapshot(args.inventory, catalog)
        problems = unfittable_problems(catalog, inventory, locate=field_locator(catalog.root))
        if problems:
            raise CatalogInvalid(problems)
    nodes, models = len(catalog.fleet.nodes), len(catalog.models)
    replicas = sum(m.replicas for m in catalog.models)
    print(f"catalog is valid: {nodes} node{'s' * (nodes != 1)}, {models} model{'s' * (models != 1)}, {replicas} replica{'s' * (replicas != 1)}")
    return Exit.OK
