"""Small builders for fleets, inventories and catalogs used by the placement and plan tests."""

from __future__ import annotations

from reconciler.model import (
    Catalog,
    Disk,
    FabricAttachment,
    Fleet,
    Gpu,
    GpuProcess,
    Inventory,
    Model,
    NodeSpec,
    ObservedNode,
    Profile,
    RunningRank,
    frozen_map,
)


def node_spec(id, *, labels=None, state="ready", fabrics=None, model_dirs=("/models",), gpu_class=None, data_address=None):
    return NodeSpec(
        id=id, address=f"10.0.0.{abs(hash(id)) % 250 + 1}", data_address=data_address or f"10.1.0.{abs(hash(id)) % 250 + 1}",
        labels=frozen_map(labels), state=state, model_dirs=tuple(model_dirs),
        fabrics=frozen_map({k: tuple(v) for k, v in (fabrics or {}).items()}), gpu_class=gpu_class,
    )


def gpus(n, cls="H100-80GB", *, nvlink=None, busy=()):
    """n GPUs of one class. nvlink: list of domains (lists of indices); default all in one domain."""
    domains = nvlink if nvlink is not None else [list(range(n))]
    peers = {i: () for i in range(n)}
    for d in domains:
        for i in d:
            peers[i] = tuple(j for j in d if j != i)
    out = []
    for i in range(n):
        procs = (GpuProcess(4242, "python", 1000),) if i in busy else ()
        out.append(Gpu(index=i, uuid=f"GPU-{i}", name=f"NVIDIA {cls}", gpu_class=cls, memory_total_mb=81559,
                       nvlink_peers=peers[i], processes=procs))
    return tuple(out)


def observed(id, *, gpu=(), state="ready", reason="", engines=("vllm", "sglang", "llama.cpp"), memory_gib=1024,
             fabrics=None, disk_free_gib=2000, weights=None, replicas=(), ports_in_use=(), labels=None):
    return ObservedNode(
        id=id, state=state, reason=reason, labels=frozen_map(labels),
        memory_total_mb=None if memory_gib is None else int(memory_gib * 1024),
        engines=None if engines is None else frozen_map({e: "" for e in engines}),
        gpus=tuple(gpu),
        fabrics=tuple(FabricAttachment(k, tuple(v)) for k, v in (fabrics or {}).items()),
        disks=() if disk_free_gib is None else (Disk("/models", int(disk_free_gib * (1 << 30)), 4000 << 30),),
        weights=None if weights is None else tuple(weights),
        replicas=tuple(replicas), ports_in_use=tuple(ports_in_use),
    )


def profile(name="p", engine="vllm", gpu_class="H100-80GB", gpus_per_node=None, nodes=1, priority=0, **kw):
    if gpu_class is None:
        gpn = 0
    else:
        gpn = 1 if gpus_per_node is None else gpus_per_node
    port = kw.pop("port", {"vllm": 8000, "sglang": 30000, "llama.cpp": 8080}.get(engine, 9000))
    sel = kw.pop("node_selector", None)
    return Profile(name=name, engine=engine, gpu_class=gpu_class, gpus_per_node=gpn, nodes=nodes,
                   priority=priority, node_selector=frozen_map(sel), port=port, **kw)


def model(name="m", *profiles, replicas=1, source=None, spread="required", fetch=None, update=None):
    profs = tuple(sorted(profiles or (profile(),), key=lambda p: -p.priority))
    return Model(name=name, source=source or f"/models/{name}", replicas=replicas, spread=spread, profiles=profs,
                 file=f"models/{name}.yaml", fetch=fetch, update=update)


def fleet(*specs):
    return Fleet(nodes=tuple(specs))


def inventory(*nodes):
    return Inventory(tuple(nodes))


def catalog(fleet_, *models, root="/tmp/catalog"):
    return Catalog(root=root, fleet=fleet_, models=tuple(sorted(models, key=lambda m: m.name)))


def rank(rid, model_name, prof, r=0, gpus=(), port=8000, spec_hash="x", nnodes=1, alive=True):
    return RunningRank(id=rid, model=model_name, profile=prof, rank=r, gpus=tuple(gpus), port=port,
                       spec_hash=spec_hash, nnodes=nnodes, alive=alive)
