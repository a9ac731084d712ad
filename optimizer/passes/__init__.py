"""The passes: each proposes settings of one kind for a recorded run, or says why it has none.

A pass is a function ``(analysis) -> Proposals``; :data:`PASSES` names them in the order the
search combines them (one setting of each pass per strategy).
"""

from __future__ import annotations

from dpro.optimizer.passes.accumulation import gradient_accumulation
from dpro.optimizer.passes.base import Proposals
from dpro.optimizer.passes.checkpointing import checkpointing
from dpro.optimizer.passes.compression import compression
from dpro.optimizer.passes.fsdp import fsdp_mesh, fsdp_prefetch, fsdp_reshard, fsdp_units
from dpro.optimizer.passes.ddp_flags import memory, static_graph
from dpro.optimizer.passes.operator_fusion import operator_fusion
from dpro.optimizer.passes.pipeline import pipeline_schedule
from dpro.optimizer.passes.tensor_parallel import tp_mesh
from dpro.optimizer.passes.tensor_fusion import first_bucket, tensor_fusion

PASSES = {"tensor_fusion": tensor_fusion, "first_bucket": first_bucket, "compression": compression, "memory": memory,
          "static_graph": static_graph, "checkpointing": checkpointing, "gradient_accumulation": gradient_accumulation, "operator_fusion": operator_fusion,
          "fsdp_reshard": fsdp_reshard, "fsdp_prefetch": fsdp_prefetch,
          "fsdp_units": fsdp_units, "fsdp_mesh": fsdp_mesh, "tp_mesh": tp_mesh, "pipeline_schedule": pipeline_schedule}

__all__ = ["PASSES", "Proposals", "checkpointing", "compression", "first_bucket", "fsdp_mesh", "fsdp_prefetch",
           "fsdp_reshard", "fsdp_units", "gradient_accumulation", "memory", "operator_fusion", "pipeline_schedule", "static_graph",
           "tensor_fusion", "tp_mesh"]
