"""Load a catalog directory into an immutable Catalog, or report every problem in it.

Three layers of checks, each reporting at the line and column of the
offending value:

1. bytes and YAML: UTF-8, syntax, tabs, duplicate keys, a mapping at the top;
2. the JSON Schemas in schema/ (field names, types, ranges, enums);
3. what a schema cannot say: unique ids and names, engines that can run
   without GPUs, loopback addresses in a multi-node fleet, placeholders only
   where they are resolved, one fabric per HCA.

A file that fails an earlier layer is not checked by the later ones (its
values cannot be trusted), but every other file still is, so one run shows
every problem in the catalog.

The modules, by job (.importlinter keeps them importing downward):

    load          the directory: which files, in which order; every problem in one CatalogInvalid
    build         the frozen Fleet and Models, from documents that passed every check
    rules         layer 3, what a schema cannot say: a model file
    fleet_rules   layer 3, what a schema cannot say: fleet.yaml, and llama.cpp's RPC over the fleet's IPv6 nodes
    schema_check  layer 2, the JSON Schemas, each error in YAML's words at its position
    documents     layer 1, bytes and YAML: bounded reads, the fast and the positioned reader

Callers import from the package (`from reconciler.catalog import load_catalog`).
"""

from reconciler.catalog.build import build_fleet, build_model, build_profile
from reconciler.catalog.documents import MAX_FILE_BYTES, MAX_VALUES, parse_yaml_text, position
from reconciler.catalog.load import FLEET_FILE, MODELS_DIR, field_locator, git_revision, load_catalog, model_at
from reconciler.catalog.fleet_rules import fleet_problems, llama_ipv6_problems
from reconciler.catalog.rules import model_problems
from reconciler.catalog.schema_check import schema_problems
from reconciler.errors import CatalogInvalid
from reconciler.engines.render import placeholders_in

# The two readers and the loader under the names the fast-path equivalence tests have always used.
from reconciler.catalog.documents import read_fast as _read_fast, read_positioned as _read  # noqa: E402,F401
from reconciler.catalog.load import _load  # noqa: E402,F401

__all__ = [
    "CatalogInvalid", "FLEET_FILE", "MAX_FILE_BYTES", "MAX_VALUES", "MODELS_DIR", "build_fleet", "build_model", "build_profile",
    "field_locator", "fleet_problems", "git_revision", "llama_ipv6_problems", "load_catalog", "model_at", "model_problems",
    "parse_yaml_text", "placeholders_in", "position", "schema_problems",
]
