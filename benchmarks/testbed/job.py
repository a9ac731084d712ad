"""An emulated-device DDP job: every layer's compute is a custom op that holds its thread for a set
time without using the CPU, as a device kernel's launch-and-wait would; its parameters are real,
and DDP all-reduces their gradients over the backend as usual.

The op, ``dpro_testbed::hold(x, w, fixed_us, per_sample_us)``, sleeps ``fixed_us + per_sample_us
× batch`` µs and returns ``x``'s copy; its backward sleeps ``backward_ratio`` times as long and
returns the gradient of ``x`` and a zero gradient of ``w`` (a parameter-sized write, as a real
layer's would be). It shows in torch.profiler as ``dpro_testbed::hold`` and its backward as
autograd's node of it, like any op.

    torchrun --standalone --nproc-per-node 2 benchmarks/testbed/job.py --spec spec.json --steps 30

``--spec``: a :class:`~benchmarks.testbed.spec.JobSpec` as JSON (its ``layers``: each layer's
parameter count and times). The DDP settings dpro's what-ifs change are flags: ``--bucket-cap-mb``,
``--first-bucket-mb``, ``--comm-hook fp16|powersgd:RANK``, ``--accumulate K`` (the batch in ``K``
micro-batches, DDP's ``no_sync`` on all but the last). ``--step-times PATH``: rank 0 writes each
step's time there, so that a run is measured without any profiler or hook.

``--form fsdp``: each layer and then the model under FSDP2's ``fully_shard`` (``--no-reshard``:
``reshard_after_forward=False``; ``--forward-prefetch K``: each unit, the model first, prefetches
the next ``K`` units in its forward pass; ``--layers-per-unit G``: every ``G`` layers one unit;
``--replicate R``: sharded over ``world/R`` ranks, replicated over ``R``, HSDP) instead of DDP. ``--form pp``: the layers split into one stage
per rank (as evenly as their held times allow), the batch in ``--microbatches`` micro-batches
under ``--schedule gpipe|1f1b``; the last stage's loss is the output's sum. ``--form tp --tp T``:
a ``(world/T, T)`` device mesh (``dp``, ``tp``); each layer split over the ``T`` ranks of its
``tp`` group as a column- then row-parallel pair is (Megatron's): its weight a DTensor sharded
over them, its input entering DTensor replicated, its held time ``1/T`` of the layer's (an ideal
split: the work divides, no fixed cost stays), its output summed over them by DTensor's
all-reduce (and its input's gradient in the backward pass); the gradients averaged over ``dp``
by an all-reduce per parameter, as the example's tensor-parallel form does. Each ``dp`` replica
runs the spec's batch.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

WIDTH = 16  # the activations' width: tiny, so that no CPU time goes to them
COLUMNS = 64  # each layer's weight is a (params / COLUMNS) x COLUMNS matrix


@torch.library.custom_op("dpro_testbed::hold", mutates_args=())
def hold(x: torch.Tensor, w: torch.Tensor, fixed_us: float, per_sample_us: float) -> torch.Tensor:
    """Hold the thread ``fixed_us + per_sample_us × batch`` µs (off the CPU); ``x``'s copy."""
    time.sleep((fixed_us + per_sample_us * x.shape[0]) * 1e-6)
    return x.clone()


@hold.register_fake
def _(x: torch.Tensor, w: torch.Tensor, fixed_us: float, per_sample_us: float) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op("dpro_testbed::hold_backward", mutates_args=())
def hold_backward(grad: torch.Tensor, w: torch.Tensor, fixed_us: float, per_sample_us: float
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """The backward of :func:`hold`: held as long as asked; the gradients of ``x`` and ``w``."""
    time.sleep((fixed_us + per_sample_us * grad.shape[0]) * 1e-6)
    return grad.clone(), torch.zeros_like(w)


class Layer(nn.Module):
    """One emulated layer: ``params`` parameters, ``forward_us`` (fixed, per sample) held forward,
    ``backward_ratio`` times that backward."""

    def __init__(self, params: int, forward_us: tuple[float, float], backward_ratio: float) -> None:
        super().__init__()
        # a matrix, as most layers' weights are (PowerSGD compresses matrices only)
        self.weight = nn.Parameter(torch.randn(max(1, params // COLUMNS), COLUMNS) * 0.01)
        self.forward_us = forward_us
        self.backward_us = (forward_us[0] * backward_ratio, forward_us[1] * backward_ratio)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return hold_with_grad(x, self.weight, self.forward_us, self.backward_us)


class _Hold(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, forward_us, backward_us):  # noqa: D102
        ctx.save_for_backward(w)
        ctx.backward_us = backward_us
        return hold(x, w, *forward_us)

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        (w,) = ctx.saved_tensors
        grad_x, grad_w = hold_backward(grad, w, *ctx.backward_us)
        return grad_x, grad_w, None, None


def hold_with_grad(x: torch.Tensor, w: torch.Tensor, forward_us: tuple[float, float],
                   backward_us: tuple[float, float]) -> torch.Tensor:
    return _Hold.apply(x, w, forward_us, backward_us)


class TPLayer(nn.Module):
    """A :class:`Layer` split over the ranks of ``mesh`` (a 1-D device mesh; see the module docstring)."""

    def __init__(self, layer: Layer, mesh) -> None:
        from torch.distributed.tensor import Shard, distribute_tensor

        super().__init__()
        self.mesh, ways = mesh, mesh.size()
        self.weight = nn.Parameter(distribute_tensor(layer.weight.detach(), mesh, [Shard(0)]))
        self.forward_us = tuple(t / ways for t in layer.forward_us)
        self.backward_us = tuple(t / ways for t in layer.backward_us)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.distributed.tensor import DTensor, Partial, Replicate

        ways = self.mesh.size()
        # entering replicated, the input's gradient is a partial sum: all-reduced in the backward pass
        mine = DTensor.from_local(x, self.mesh, [Replicate()], run_check=False).to_local(grad_placements=[Partial()])
        y = hold_with_grad(mine, self.weight.to_local(), self.forward_us, self.backward_us) / ways
        return DTensor.from_local(y, self.mesh, [Partial()], run_check=False).redistribute(
            self.mesh, [Replicate()]).to_local()


def build_tp(model: nn.Sequential, tp: int) -> tuple[nn.Sequential, object]:
    """Every layer split over the ``tp`` consecutive ranks of its group; the data-parallel group."""
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()
    if tp < 1 or world % tp:
        raise SystemExit(f"--tp {tp} does not divide the world size {world}")
    mesh = init_device_mesh("cpu", (world // tp, tp), mesh_dim_names=("dp", "tp"))
    return nn.Sequential(*(TPLayer(layer, mesh["tp"]) for layer in model)), mesh["dp"].get_group()


def build_model(spec: dict) -> nn.Sequential:
    return nn.Sequential(*(Layer(layer["params"], (layer["forward_fixed_us"], layer["forward_per_sample_us"]),
                                 spec["backward_ratio"]) for layer in spec["layers"]))


def register_comm_hook(ddp: DistributedDataParallel, name: str) -> None:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if name.startswith("powersgd:"):
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=int(name.split(":")[1]),
                                            start_powerSGD_iter=2, use_error_feedback=True, warm_start=True)
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    elif name == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    else:
        raise SystemExit(f"--comm-hook: {name!r} is not fp16 or powersgd:RANK")


def build_fsdp(model: nn.Sequential, reshard: bool, prefetch: int = 0, per_unit: int = 1,
               replicate: int = 1) -> nn.Module:
    """Every ``per_unit`` layers a unit, then the model; with ``prefetch``, each unit (the model
    first) prefetches the next ``prefetch`` units in its forward pass; ``replicate > 1``: the
    units sharded over ``world / replicate`` consecutive ranks and replicated over the rest (HSDP)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    world = dist.get_world_size()
    mesh = (init_device_mesh("cpu", (replicate, world // replicate), mesh_dim_names=("replicate", "shard"))
            if replicate > 1 else None)

    layers = list(model)
    groups = [layers[i:i + per_unit] for i in range(0, len(layers), per_unit)]
    for group in groups:
        fully_shard(group[0] if len(group) == 1 else group, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
    if prefetch:
        units = [model, *(group[0] for group in groups)]
        for i, unit in enumerate(units):
            unit.set_modules_to_forward_prefetch(units[i + 1:i + 1 + prefetch])
    return model


def stage_layers(spec: dict, stages: int) -> list[range]:
    """Contiguous runs of layers, one per stage, whose held times are as even as a greedy cut makes them."""
    times = [l["forward_fixed_us"] + l["forward_per_sample_us"] * spec["batch"] for l in spec["layers"]]
    total, cuts, acc = sum(times), [0], 0.0
    for i, t in enumerate(times):
        acc += t
        if len(cuts) < stages and acc >= total * len(cuts) / stages and len(times) - i - 1 >= stages - len(cuts):
            cuts.append(i + 1)
    cuts += [len(times)] * (stages + 1 - len(cuts))
    return [range(a, b) for a, b in zip(cuts, cuts[1:])]


def build_pipeline(model: nn.Sequential, spec: dict, microbatches: int, schedule_name: str):
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    rank, world = dist.get_rank(), dist.get_world_size()
    mine = stage_layers(spec, world)[rank]
    stage = PipelineStage(nn.Sequential(*(model[i] for i in mine)), rank, world, torch.device("cpu"))
    schedule_class = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule_name]
    return stage.submod, schedule_class(stage, n_microbatches=microbatches, loss_fn=lambda out, _: out.sum())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--spec", required=True, help="the job's JobSpec, as JSON text or a path to it")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--bucket-cap-mb", type=float, default=25.0)
    p.add_argument("--first-bucket-mb", type=float)
    p.add_argument("--comm-hook", metavar="fp16|powersgd:RANK")
    p.add_argument("--accumulate", type=int, default=1, metavar="K")
    p.add_argument("--static-graph", action="store_true", help="DDP's static_graph")
    p.add_argument("--grad-as-bucket-view", action="store_true", help="DDP's gradient_as_bucket_view")
    p.add_argument("--step-times", metavar="PATH", help="rank 0 writes each step's time (ns) here, a line each")
    p.add_argument("--form", choices=("ddp", "fsdp", "pp", "tp"), default="ddp")
    p.add_argument("--tp", type=int, default=2, metavar="T", help="tp: the tensor-parallel degree")
    p.add_argument("--no-reshard", action="store_true", help="fsdp: reshard_after_forward=False")
    p.add_argument("--forward-prefetch", type=int, default=0, metavar="K", help="fsdp: each unit prefetches the next K")
    p.add_argument("--layers-per-unit", type=int, default=1, metavar="G", help="fsdp: every G layers one unit")
    p.add_argument("--replicate", type=int, default=1, metavar="R", help="fsdp: replicated over R, HSDP")
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--schedule", choices=("gpipe", "1f1b"), default="gpipe")
    args = p.parse_args()
    spec = json.loads(args.spec if args.spec.lstrip().startswith("{") else open(args.spec).read())
    if spec["batch"] % args.accumulate:
        p.error(f"--accumulate must divide the batch {spec['batch']}")
    dist.init_process_group("gloo")
    torch.manual_seed(spec.get("seed", 0))
    torch.set_num_threads(1)
    if args.form != "ddp":
        run_parallel(args, spec, build_model(spec))  # it holds the only reference: freed before the group
        return
    model = build_model(spec)
    options = {"bucket_cap_mb": args.bucket_cap_mb}
    if args.first_bucket_mb is not None:
        options = {"bucket_cap_mb_list": [args.first_bucket_mb, args.bucket_cap_mb]}
    ddp = DistributedDataParallel(model, static_graph=args.static_graph,
                                  gradient_as_bucket_view=args.grad_as_bucket_view, **options)
    if args.comm_hook:
        register_comm_hook(ddp, args.comm_hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    batch = torch.randn(spec["batch"], WIDTH)
    ends = [time.perf_counter_ns()]
    for _ in range(args.steps):
        optimizer.zero_grad(set_to_none=False)
        micro = batch.chunk(args.accumulate)
        for i, x in enumerate(micro):
            with ddp.no_sync() if i < len(micro) - 1 else contextlib.nullcontext():
                ddp(x).sum().backward()
        optimizer.step()
        ends.append(time.perf_counter_ns())
    if args.step_times and dist.get_rank() == 0:
        with open(args.step_times, "w") as f:
            f.writelines(f"{b - a}\n" for a, b in zip(ends, ends[1:]))
    # DDP's reducer sits in reference cycles: freed now, gloo's workers are joined before
    # interpreter shutdown (see examples/train_lm.py)
    del ddp, optimizer, model
    gc.collect()
    dist.destroy_process_group()


def run_parallel(args: argparse.Namespace, spec: dict, model: nn.Sequential) -> None:
    """The FSDP, tensor-parallel or pipeline form of the job (see the module docstring)."""
    rank = dist.get_rank()
    batch = torch.randn(spec["batch"], WIDTH)
    if args.form == "tp":
        module, dp_group = build_tp(model, args.tp)
        replicas = dist.get_world_size(dp_group)

        def step() -> None:
            module(batch).sum().backward()
            if replicas > 1:
                for param in module.parameters():
                    grad = param.grad.to_local() if hasattr(param.grad, "to_local") else param.grad
                    dist.all_reduce(grad, group=dp_group)
                    grad.div_(replicas)
    elif args.form == "fsdp":
        module = build_fsdp(model, not args.no_reshard, args.forward_prefetch, args.layers_per_unit,
                            args.replicate)

        def step() -> None:
            module(batch).sum().backward()
    else:
        module, schedule = build_pipeline(model, spec, args.microbatches, args.schedule)
        last = rank == dist.get_world_size() - 1

        def step() -> None:
            if rank == 0:
                schedule.step(batch)
            elif last:
                schedule.step(target=batch)
            else:
                schedule.step()
    optimizer = torch.optim.SGD(module.parameters(), lr=1e-3)
    ends = [time.perf_counter_ns()]
    for _ in range(args.steps):
        optimizer.zero_grad(set_to_none=False)
        step()
        optimizer.step()
        ends.append(time.perf_counter_ns())
    if args.step_times and rank == 0:
        with open(args.step_times, "w") as f:
            f.writelines(f"{b - a}\n" for a, b in zip(ends, ends[1:]))
    # freed before the group is destroyed (see examples/train_lm.py): step's closure holds the module
    step = module = schedule = optimizer = model = dp_group = None  # type: ignore[assignment]
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
