"""Layer 3 of the catalog's checks for fleet.yaml: what a schema cannot say. Unique node ids, one
fabric per HCA, data addresses an engine can take on its command line, loopback addresses in a
multi-node fleet, Slurm's section and node names, the leader's etcd endpoints and TLS files, and
llama.cpp's RPC over IPv6 (a check of the fleet against the models that may place ranks on it).
"""

from __future__ import annotations

import os
from typing import Mapping

from reconciler.errors import Problem
from reconciler.model import Model
from reconciler.host import parse_host
from reconciler.catalog.documents import Document


def fleet_problems(doc: Document, root: str | None = None) -> list[Problem]:
    problems: list[Problem] = _leader_problems(doc, root)
    nodes = doc.data.get("nodes") or []
    seen: dict[str, int] = {}
    for i, node in enumerate(nodes):
        nid = node["id"]
        if nid in seen:
            problems.append(doc.at(("nodes", i, "id"), f"duplicate node id '{nid}' (first defined as nodes[{seen[nid]}])"))
        else:
            seen[nid] = i
        owner: dict[str, str] = {}
        for fabric, hcas in (node.get("fabrics") or {}).items():
            for j, hca in enumerate(hcas):
                if hca in owner:
                    problems.append(
                        doc.at(("nodes", i, "fabrics", fabric, j), f"node {nid}: HCA {hca} is declared on both fabric {owner[hca]} and {fabric}")
                    )
                owner[hca] = fabric
    for i, node in enumerate(nodes):
        # Engines get the data address as a command-line value (`--rpc a:1,b:2`, `--master-addr a`):
        # a comma, colon or space in a name would splice in another endpoint or break the flag.
        field = "data_address" if "data_address" in node else "address"
        value = str(node.get(field, ""))
        if value and not parse_host(value).is_valid:
            hint = "" if field == "data_address" else " (an ~/.ssh/config alias works for address; then set data_address)"
            problems.append(doc.at(("nodes", i, field), f"node {node['id']}: {field} {value!r} is not a host name or an IP address{hint}"))
    problems += _slurm_problems(doc, nodes, seen)
    if len(nodes) > 1:
        for i, node in enumerate(nodes):
            for field in ("address", "data_address"):
                value = node.get(field)
                if value is not None and parse_host(str(value)).is_loopback:
                    problems.append(
                        doc.at(
                            ("nodes", i, field),
                            f"node {node['id']}: {field} {value} is loopback; in a fleet of several nodes a loopback "
                            "address makes every multi-node replica talk to itself",
                        )
                    )
    return problems


def _slurm_problems(doc: Document, nodes: list, ids: Mapping[str, int]) -> list[Problem]:
    """SPEC section 8: `launcher: slurm` needs the `slurm:` section, whose submit_via names a node or `local`."""
    problems: list[Problem] = []
    slurm = doc.data.get("slurm")
    if slurm is not None:
        via = slurm.get("submit_via")
        if via != "local" and via not in ids:
            problems.append(doc.at(("slurm", "submit_via"), f"submit_via {via!r} is neither a node id of this fleet nor `local`"))
    names: dict[str, str] = {}
    for i, node in enumerate(nodes):
        if node.get("launcher") == "slurm" and slurm is None:
            problems.append(doc.at(("nodes", i, "launcher"), f"node {node['id']}: launcher: slurm needs a `slurm:` section in fleet.yaml (where sbatch runs)"))
        if node.get("launcher") == "slurm":
            name = node.get("slurm_name", node["id"])
            if name in names:
                problems.append(doc.at(("nodes", i, "slurm_name" if "slurm_name" in node else "id"),
                                       f"node {node['id']}: Slurm node {name} is also node {names[name]}"))
            names[name] = node["id"]
    return problems


ETCD_SCHEMES = ("http", "https")


def _leader_problems(doc: Document, root: str | None) -> list[Problem]:
    """SPEC section 14: `leader.etcd`'s endpoints are URLs, and its TLS files are there (relative to
    the catalog) on this management host: a daemon must not find out at its first election."""
    from urllib.parse import urlsplit

    leader = doc.data.get("leader")
    if not isinstance(leader, Mapping):
        return []
    etcd = leader.get("etcd") or {}
    problems: list[Problem] = []
    for i, endpoint in enumerate(etcd.get("endpoints") or ()):
        try:
            url = urlsplit(str(endpoint))
            port = url.port
        except ValueError as exc:
            problems.append(doc.at(("leader", "etcd", "endpoints", i), f"etcd endpoint {endpoint!r}: {exc}"))
            continue
        if url.scheme not in ETCD_SCHEMES or not url.hostname or url.path not in ("", "/") or url.query:
            problems.append(doc.at(("leader", "etcd", "endpoints", i),
                                   f"etcd endpoint {endpoint!r} is not a URL such as https://etcd-1:2379 "
                                   "(http or https, a host, a port, no path)"))
        elif port is None:
            problems.append(doc.at(("leader", "etcd", "endpoints", i),
                                   f"etcd endpoint {endpoint!r} has no port (etcd's client port is usually 2379)"))
    for field in ("ca_file", "cert_file", "key_file"):
        name = etcd.get(field)
        if name is None:
            continue
        path = os.path.join(root, os.path.expanduser(str(name))) if root is not None else os.path.expanduser(str(name))
        if not os.path.isfile(path):
            problems.append(doc.at(("leader", "etcd", field), f"leader.etcd.{field}: {name}: no such file on this host"))
    if ("cert_file" in etcd) != ("key_file" in etcd):
        given, missing = ("cert_file", "key_file") if "cert_file" in etcd else ("key_file", "cert_file")
        problems.append(doc.at(("leader", "etcd", given), f"leader.etcd.{given} needs {missing} too"))
    return problems


def llama_ipv6_problems(fleet_doc: Document, models: list[Model]) -> list[Problem]:
    """An IPv6 data address on a node a multi-node llama.cpp profile may place a rank on.

    ggml's RPC speaks IPv4 only: the head aborts on `--rpc [v6]:port` and the RPC server
    exits 0 without serving on a v6 host, so such a replica could never run there.
    """
    problems = []
    nodes = fleet_doc.data.get("nodes") or []
    profiles = [(m, p) for m in models for p in m.profiles if p.engine == "llama.cpp" and p.nodes > 1]
    for i, node in enumerate(nodes):
        field = "data_address" if "data_address" in node else "address"
        if not parse_host(str(node.get(field, ""))).is_ipv6:
            continue
        labels = node.get("labels") or {}
        for model, prof in profiles:
            if all(labels.get(k) == v for k, v in prof.node_selector.items()):
                problems.append(fleet_doc.at(
                    ("nodes", i, field),
                    f"node {node['id']}: {field} {node[field]} is IPv6, and model {model.name} profile {prof.name} "
                    f"(llama.cpp on {prof.nodes} nodes) may place a rank here; llama.cpp's RPC speaks IPv4 only: give "
                    "the node an IPv4 data_address, or the profile a node_selector that leaves it out",
                ))
                break
    return problems

