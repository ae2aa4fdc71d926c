"""Leave the nodes as a test found them: every rank this catalog's owner manages, stopped through the node agent."""

from __future__ import annotations

from pathlib import Path


def stop_every_rank(root: Path) -> None:
    from reconciler.catalog import load_catalog
    from reconciler.act.launcher import SshLauncher
    from reconciler.owner import catalog_owner
    from reconciler.observe.ssh import TransportPool

    cat = load_catalog(root, with_revision=False)
    with TransportPool() as pool:
        launcher = SshLauncher.for_fleet(cat.fleet, {n.id: pool.transport_for(n) for n in cat.fleet.nodes},
                                         stop_grace_s=2, owner=catalog_owner(cat))
        for node in cat.fleet.nodes:
            for rank in launcher.ranks(node.id):
                launcher.stop(node.id, rank.replica)
