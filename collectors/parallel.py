"""What FSDP2, DeviceMesh and ``torch.distributed.pipelining`` expose about the job's parallelism.

Read once per rank when its profiling window begins (the models are built and have stepped),
from the live objects of the process: no wrapping of the job's calls, nothing imported that the
job did not import. :func:`describe` returns the ``parallel`` section of a rank's ``meta.json``:

- ``meshes``: each device mesh (largest first, its sub-meshes left out): ``shape``,
  ``dim_names``, ``ranks`` (the global ranks in mesh order) and, per dimension, this rank's
  process group name (``groups``);
- ``fsdp``: each FSDP *unit* (a ``fully_shard`` call): ``module`` (its module's name in the
  root, ``""`` for the root; the names ``", "``-joined for ``fully_shard([a, b])``, as FSDP's
  ranges name the unit), ``root``, ``parameters`` (count), ``unsharded_bytes`` and
  ``sharded_bytes`` (this rank's shard), ``reshard_after_forward``, ``forward_prefetch`` and
  ``backward_prefetch`` (the units it prefetches, when the script set them), ``shard_group``
  (the process group it shards over) and ``mesh_shape``;
- ``pipeline``: each pipeline schedule: ``schedule`` (its class), ``microbatches``,
  ``stage_index``, ``num_stages``;
- ``dtensor_parameters``: the DTensor parameters (tensor parallel's, FSDP2's), by the process
  groups they are sharded over: ``sharded_over`` (group names, ``[]`` for replicated),
  ``local_bytes`` (each parameter's, on this rank).
"""

from __future__ import annotations

import gc
import sys
from typing import Any

__all__ = ["describe"]


def describe() -> dict[str, Any]:
    """The ``parallel`` section; empty lists where the job uses none of these."""
    wanted = {name: sys.modules.get(name) for name in (
        "torch.distributed.device_mesh", "torch.distributed.fsdp", "torch.distributed.pipelining.schedules",
        "torch.distributed.tensor")}
    if not any(wanted.values()):
        return {"meshes": [], "fsdp": [], "pipeline": [], "dtensor_parameters": []}
    classes = {
        "mesh": getattr(wanted["torch.distributed.device_mesh"], "DeviceMesh", None),
        "fsdp": getattr(wanted["torch.distributed.fsdp"], "FSDPModule", None),
        "pipeline": getattr(wanted["torch.distributed.pipelining.schedules"], "_PipelineSchedule", None),
        "dtensor": getattr(wanted["torch.distributed.tensor"], "DTensor", None),
    }
    found: dict[str, list[Any]] = {kind: [] for kind in classes}
    kinds = [(kind, cls) for kind, cls in classes.items() if cls is not None]
    for obj in gc.get_objects():
        cls = type(obj)
        for kind, wanted_cls in kinds:
            if issubclass(cls, wanted_cls):  # never isinstance: some objects' __instancecheck__ warns
                found[kind].append(obj)
    return {"meshes": _meshes(found["mesh"]), "fsdp": _fsdp_units(found["fsdp"]),
            "pipeline": [_schedule(s) for s in found["pipeline"]],
            "dtensor_parameters": _dtensor_parameters(found["dtensor"])}


def _meshes(meshes: list[Any]) -> list[dict[str, Any]]:
    described = []
    for mesh in meshes:
        ranks = mesh.mesh.tolist()
        names = list(mesh.mesh_dim_names) if mesh.mesh_dim_names else None
        groups = []
        for dim in range(mesh.ndim):
            try:
                groups.append(mesh.get_group(dim).group_name)
            except Exception:
                groups.append(None)
        described.append({"shape": list(mesh.mesh.shape), "dim_names": names, "ranks": ranks, "groups": groups})
    described.sort(key=lambda m: -len(m["shape"]))
    kept: list[dict[str, Any]] = []
    for m in described:  # a sub-mesh's groups are among a larger mesh's
        if not any(set(filter(None, m["groups"])) <= set(filter(None, k["groups"])) for k in kept):
            kept.append(m)
    return kept


def _dtensor_parameters(tensors: list[Any]) -> list[dict[str, Any]]:
    """The DTensor parameters' local sizes, by the groups they are sharded over."""
    by_groups: dict[tuple[str, ...], list[int]] = {}
    for t in tensors:
        if not getattr(t, "_is_param", False):
            continue
        try:
            mesh = t.device_mesh
            sharded = tuple(str(mesh.get_group(dim).group_name) for dim, p in enumerate(t.placements) if p.is_shard())
            nbytes = int(t.to_local().numel()) * t.element_size()
        except Exception:  # a mesh this rank is not in, a placement of another torch
            continue
        by_groups.setdefault(sharded, []).append(nbytes)
    return [{"sharded_over": list(g), "local_bytes": sorted(b)} for g, b in sorted(by_groups.items())]


def _fsdp_units(modules: list[Any]) -> list[dict[str, Any]]:
    names: dict[int, str] = {}
    for module in modules:
        state = module._get_fsdp_state()
        if getattr(state, "_is_root", False):
            names.update({id(m): name for name, m in module.named_modules()})
    units, seen = [], set()
    for module in modules:
        state = module._get_fsdp_state()
        if id(state) in seen:  # fully_shard([a, b]): one unit of several modules
            continue
        seen.add(id(state))
        group = state._fsdp_param_group
        params = list(group.fsdp_params) if group is not None else []
        mesh_info = group.mesh_info if group is not None else None
        units.append({
            "module": _unit_name(state, names), "root": bool(getattr(state, "_is_root", False)),
            "parameters": len(params),
            "unsharded_bytes": sum(_numel(p._orig_size) * p.sharded_param.element_size() for p in params),
            "sharded_bytes": sum(_local(p.sharded_param).numel() * p.sharded_param.element_size() for p in params),
            "reshard_after_forward": None if group is None else group.post_forward_mesh_info is not None,
            "forward_prefetch": _unit_names(getattr(state, "_states_to_forward_prefetch", None), names),
            "backward_prefetch": _unit_names(getattr(state, "_states_to_backward_prefetch", None), names),
            "shard_group": _group_name(mesh_info),
            "mesh_shape": list(mesh_info.mesh.mesh.shape) if mesh_info is not None else None,
        })
    units.sort(key=lambda u: (not u["root"], u["module"]))
    return units


def _local(tensor: Any) -> Any:
    """This rank's shard of a DTensor (``numel`` of a DTensor is the global one)."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _numel(size: Any) -> int:
    n = 1
    for d in size:
        n *= int(d)
    return n


def _unit_names(states: Any, names: dict[int, str]) -> list[str] | None:
    """The units (FSDP states) a unit prefetches; None when the script set none."""
    return [_unit_name(s, names) for s in states] if states else None


def _unit_name(state: Any, names: dict[int, str]) -> str:
    """A unit's name as FSDP's ranges give it: its module's name in the root (``""`` for the
    root), the names ``", "``-joined for ``fully_shard([a, b])``."""
    group = getattr(state, "_fsdp_param_group", None)
    fqn = getattr(group, "_module_fqn", None)
    if isinstance(fqn, str):
        return fqn
    return ", ".join(names.get(id(m), type(m).__name__) for m in getattr(state, "_modules", ()))


def _group_name(mesh_info: Any) -> str | None:
    if mesh_info is None:
        return None
    try:
        return mesh_info.mesh.get_group(mesh_info.shard_mesh_dim).group_name
    except Exception:
        return None


def _schedule(schedule: Any) -> dict[str, Any]:
    stage = getattr(schedule, "_stage", None)
    stages = getattr(schedule, "_stages", None) or ([stage] if stage is not None else [])
    return {"schedule": type(schedule).__name__, "microbatches": int(schedule._n_microbatches),
            "stage_index": [int(s.stage_index) for s in stages],
            "num_stages": int(stages[0].num_stages) if stages else None}
