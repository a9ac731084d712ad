"""How a recorded job is parallel: its process groups, device mesh, FSDP units and pipeline.

Read from the ranks' ``meta.json`` (``process_groups`` and ``parallel``, written by
:mod:`dpro.collectors.metadata` and :mod:`dpro.collectors.parallel`).

    >>> Parallelism.of(RunAnalysis.open("run").metas).describe()     # doctest: +SKIP
    'FSDP2: 5 units over 2 ranks, resharded after forward'
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from dpro.run_records import RankMeta

__all__ = ["Parallelism"]


@dataclass(frozen=True)
class Parallelism:
    """``groups``: process group name -> its description, ranks and backends (``backend_config``:
    ``"cpu:gloo,cuda:nccl"``; every rank's view merged);
    ``mesh``: the largest device mesh (``shape``, ``dim_names``, ``groups``) or None; ``fsdp``:
    rank 0's FSDP units; ``pipeline``: rank 0's schedule or None; ``stages``: each rank's
    pipeline stage (ranks with one stage only); ``sharded_parameters``: each rank's local bytes
    of each DTensor parameter sharded over a mesh dimension (tensor parallel's; FSDP2's too)."""

    world_size: int
    groups: dict[str, dict[str, Any]] = field(default_factory=dict)
    mesh: dict[str, Any] | None = None
    fsdp: list[dict[str, Any]] = field(default_factory=list)
    pipeline: dict[str, Any] | None = None
    stages: dict[int, int] = field(default_factory=dict)
    sharded_parameters: dict[int, list[int]] = field(default_factory=dict)

    @classmethod
    def of(cls, metas: dict[int, RankMeta]) -> Parallelism:
        groups: dict[str, dict[str, Any]] = {}
        for meta in metas.values():
            for g in meta.process_groups:
                groups.setdefault(str(g["pg_name"]), {"desc": g.get("pg_desc", ""), "ranks": g.get("ranks", []),
                                                      "backend": g.get("backend_config", "")})
        first = metas[min(metas)] if metas else RankMeta()
        parallel = first.parallel
        return cls(world_size=first.world_size or len(metas) or 1, groups=groups,
                   mesh=parallel.meshes[0] if parallel.meshes else None, fsdp=list(parallel.fsdp),
                   pipeline=parallel.pipeline[0] if parallel.pipeline else None,
                   stages={r: m.parallel.stage for r, m in metas.items() if m.parallel.stage is not None},
                   sharded_parameters={r: m.parallel.sharded_parameter_bytes for r, m in metas.items()})

    @property
    def data_parallel_only(self) -> bool:
        """Whether the job is plain data parallel (DDP or none): no FSDP, no mesh of two or more
        dimensions, no pipeline."""
        return not self.fsdp and self.pipeline is None and not (self.mesh and len(self.mesh["shape"]) > 1)

    @property
    def fsdp_mesh_shape(self) -> tuple[int, ...] | None:
        """The shape of the mesh the FSDP units that hold parameters ran on (rank 0's; ``(N,)``
        for FSDP2's own 1-D mesh where none was recorded); None without FSDP."""
        units = [u for u in self.fsdp if u.get("parameters")] or self.fsdp
        if not units:
            return None
        return tuple(int(n) for n in units[0].get("mesh_shape") or [self.world_size])

    @property
    def tensor_parallel(self) -> bool:
        """Whether the job has a device mesh of two or more dimensions other than its FSDP
        units' own (HSDP's ``(replicate, shard)`` is data parallel)."""
        if not self.mesh or len(self.mesh["shape"]) < 2:
            return False
        return self.fsdp_mesh_shape != tuple(self.mesh["shape"])

    def group_label(self, pg_name: str) -> str:
        """A process group as a user knows it: its mesh dimension, else its description, else its name."""
        if self.mesh and pg_name in (self.mesh.get("groups") or []):
            names = self.mesh.get("dim_names")
            dim = self.mesh["groups"].index(pg_name)
            return f"{names[dim] if names else f'mesh dim {dim}'} (group {pg_name})"
        desc = self.groups.get(pg_name, {}).get("desc")
        if self.pipeline is not None and desc == "default_pg":
            return f"pipeline (group {pg_name})"
        return f"{desc} (group {pg_name})" if desc else f"group {pg_name}"

    @property
    def fsdp_reshard(self) -> bool | None:
        """Whether the FSDP units that hold parameters reshard after forward; None without FSDP.
        The root unit decides only alone: FSDP2 keeps the root gathered when the script leaves
        the setting to its default (torch 2.13's heuristic), whatever the other units do."""
        units = [u for u in self.fsdp if u.get("parameters")]
        inner = [u for u in units if not u.get("root")] or units
        return all(bool(u.get("reshard_after_forward")) for u in inner) if inner else None

    @property
    def fsdp_forward_prefetch(self) -> int:
        """How many units ahead each FSDP unit prefetches in its forward pass (the longest list
        the script set with ``set_modules_to_forward_prefetch``; 0, FSDP2's default, for none)."""
        return max((len(u.get("forward_prefetch") or []) for u in self.fsdp), default=0)

    def coordinate(self, rank: int) -> str:
        """The rank's place in the device mesh (``"dp 0 · tp 1"``), ``""`` without a mesh of 2 or more dimensions."""
        if not self.mesh or len(self.mesh["shape"]) < 2:
            return ""
        import numpy as np

        at = np.argwhere(np.asarray(self.mesh["ranks"]) == rank)
        if not len(at):
            return ""
        names = self.mesh.get("dim_names") or [f"dim {i}" for i in range(len(self.mesh["shape"]))]
        return " · ".join(f"{n} {int(i)}" for n, i in zip(names, at[0]))

    def describe(self) -> str:
        """One line: the parallel forms of the job."""
        parts = []
        if self.fsdp:
            reshard = self.fsdp_reshard
            ranks = math.prod(self.fsdp[0].get("mesh_shape") or [self.world_size])
            parts.append(f"FSDP2: {len(self.fsdp)} units over {ranks} ranks"
                         f"{', resharded after forward' if reshard else ''}")
        if self.mesh and len(self.mesh["shape"]) > 1:
            names = self.mesh.get("dim_names") or [f"dim {i}" for i in range(len(self.mesh["shape"]))]
            parts.append("mesh " + "×".join(str(n) for n in self.mesh["shape"]) + f" ({', '.join(names)})")
        if self.pipeline:
            p = self.pipeline
            parts.append(f"pipeline {p['schedule']}: {p['num_stages']} stages, {p['microbatches']} micro-batches")
        return "; ".join(parts) or f"data parallel over {self.world_size} ranks"
