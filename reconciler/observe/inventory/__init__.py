"""The inventory snapshot (SPEC section 3): documents <-> model, checking, and fast loading.

reading: a snapshot file -> its document -> an Inventory; writing: an Inventory -> its document
and text; validation: every problem of a document, and load_inventory, which reads and checks.
"""

from reconciler.observe.inventory.reading import inventory_from_document, node_from_document, read_snapshot_document
from reconciler.observe.inventory.validation import drop_unknown_nodes, load_inventory, validate_inventory_document
from reconciler.observe.inventory.writing import inventory_to_document, node_to_document, snapshot_text, utc_text

__all__ = [
    "drop_unknown_nodes",
    "inventory_from_document",
    "inventory_to_document",
    "load_inventory",
    "node_from_document",
    "node_to_document",
    "read_snapshot_document",
    "snapshot_text",
    "utc_text",
    "validate_inventory_document",
]
