"""``dpro whatif``: the step time of a recorded job under a configuration nobody ran."""

from __future__ import annotations

import json
from typing import Any

import click

from dpro.cli.options import RUN, analysis_options, ms, open_analysis, table
from dpro.comm_hooks import CAST_HOOKS, POWERSGD, compress_flag, parse_compress


class Compression(click.ParamType):
    """``fp16``, ``bf16`` or ``powersgd:RANK`` (DDP's compression hooks)."""

    name = "|".join((*CAST_HOOKS, f"{POWERSGD}:RANK"))

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            return compress_flag(*parse_compress(str(value)))
        except ValueError as e:
            self.fail(str(e), param, ctx)


@click.command()
@click.argument("run", type=RUN)
@click.option("--bucket-cap-mb", type=click.FloatRange(min=0, min_open=True), metavar="MB",
              help="DDP's bucket cap: the buckets rebuilt as DDP would build them.")
@click.option("--first-bucket-mb", type=click.FloatRange(min=0, min_open=True), metavar="MB",
              help="DDP's first bucket's cap (bucket_cap_mb_list=[MB, cap]), the others' as recorded or --bucket-cap-mb.")
@click.option("--bandwidth-scale", type=click.FloatRange(min=0, min_open=True), metavar="F",
              help="Every link F times as fast as recorded.")
@click.option("--compress", type=Compression(),
              help="DDP's fp16, bf16 or PowerSGD (of that rank) compression hook on every bucket.")
@click.option("--accumulate", type=click.IntRange(min=2), metavar="K",
              help="Gradient accumulation: each step's batch in K micro-batches, one all-reduce a step.")
@click.option("--fuse-ops", is_flag=True, default=None,
              help="Operator fusion as torch.compile would make it (TorchInductor's fused kernels).")
@click.option("--world-size", type=click.IntRange(min=2), metavar="N",
              help="The same data-parallel job over N ranks (per-rank batch fixed).")
@click.option("--ranks-per-host", type=click.IntRange(min=1), metavar="R",
              help="With --world-size: ranks sharing a host (default: as recorded).")
@click.option("--reshard-after-forward/--no-reshard-after-forward", default=None,
              help="FSDP2: every unit resharded after its forward pass, or kept gathered until its backward.")
@click.option("--forward-prefetch", type=click.IntRange(min=0), metavar="K",
              help="FSDP2: each unit's forward all-gather issued by the unit K before it "
                   "(set_modules_to_forward_prefetch; 0: none, FSDP2's default).")
@click.option("--merge-units", type=click.IntRange(min=2), metavar="G",
              help="FSDP2: every G consecutive units (the root apart) wrapped as one, fully_shard([...]).")
@click.option("--fsdp-mesh", metavar="RxS",
              help="FSDP2 over a (replicate, shard) mesh of the same ranks: sharded over S consecutive ranks, "
                   "replicated over R (HSDP, e.g. 2x2; 1xN: sharded over all).")
@click.option("--tp-mesh", metavar="DPxTP",
              help="Tensor parallel on a (dp, tp) mesh of the same ranks: layers split over TP consecutive ranks, "
                   "data parallel over DP (e.g. 4x1, 2x2, 1x4; each replica's batch as recorded).")
@click.option("--microbatches", type=click.IntRange(min=1), metavar="M",
              help="Pipeline: the step's batch in M micro-batches (the same batch per step).")
@click.option("--schedule", type=click.Choice(["gpipe", "1f1b"]),
              help="Pipeline: GPipe (every forward, then every backward) or 1F1B.")
@click.option("--microbatch-run", type=click.Path(exists=True, file_okay=False), metavar="RUN2",
              help="Pipeline: a recording of the same job at another micro-batch count; the two show what "
                   "each stage's passes cost whatever the micro-batch's size.")
@click.option("--without-probe", is_flag=True,
              help="Pipeline: leave out the run's probe steps (dpro record's steps at half the micro-batches), "
                   "as for a run recorded without them: the passes' fixed part is then unknown (a range).")
@click.option("--no-interference", is_flag=True,
              help="Ops keep their recorded durations whatever their overlap with communication.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@analysis_options
def whatif(run: Any, bucket_cap_mb: float | None, first_bucket_mb: float | None, bandwidth_scale: float | None, compress: str | None,
           accumulate: int | None, fuse_ops: bool | None, world_size: int | None, ranks_per_host: int | None, reshard_after_forward: bool | None,
           forward_prefetch: int | None, merge_units: int | None, fsdp_mesh: str | None, tp_mesh: str | None, microbatches: int | None, schedule: str | None, microbatch_run: str | None, without_probe: bool, no_interference: bool, as_json: bool,
           scheduler: str | None, workers: int | None) -> None:
    """Predict the step time of RUN's job with its configuration changed."""
    from dpro.analysis.whatif import Change, predict

    if ranks_per_host is not None and world_size is None:
        raise click.UsageError("--ranks-per-host goes with --world-size")
    if fsdp_mesh is not None:
        from dpro.analysis.fsdp import parse_mesh

        parse_mesh(fsdp_mesh)  # a one-line error before the run is read
    if tp_mesh is not None:
        from dpro.analysis.tensor_parallel import parse_tp_mesh

        parse_tp_mesh(tp_mesh)
    change = Change(bucket_cap_mb=bucket_cap_mb, first_bucket_mb=first_bucket_mb, bandwidth_scale=bandwidth_scale,
                    compress=compress, world_size=world_size, ranks_per_host=ranks_per_host, accumulate=accumulate,
                    fuse_ops=fuse_ops or None, reshard_after_forward=reshard_after_forward,
                    forward_prefetch=forward_prefetch, merge_units=merge_units, fsdp_mesh=fsdp_mesh, tp_mesh=tp_mesh,
                    microbatches=microbatches, schedule=schedule, microbatch_run=microbatch_run,
                    probe_steps=False if without_probe else None)
    if change == Change():
        raise click.UsageError("nothing to change: give --bucket-cap-mb, --first-bucket-mb, --bandwidth-scale, "
                               "--compress, --accumulate, --fuse-ops, --world-size, --[no-]reshard-after-forward, --forward-prefetch, --merge-units, "
                               "--fsdp-mesh, --tp-mesh, --microbatches or --schedule")
    result = predict(open_analysis(run, scheduler, workers), change, interference=not no_interference)
    if as_json:
        click.echo(json.dumps(result, indent=1))
        return
    click.echo("change: " + ", ".join(f"{k.replace('_', '-')} {v}" for k, v in result["change"].items()))
    rows = [("rank", "baseline ms", "predicted ms", "change %", "replay as recorded ms", "replay changed ms")]
    for r in [*result["per_rank"], {**result, "rank": "job"}]:
        base, pred = r["baseline_step_ms"], r["predicted_step_ms"]
        rows.append((str(r["rank"]), ms(base), ms(pred), "-" if base is None else f"{100 * (pred / base - 1):+.1f}",
                     ms(r["replayed_step_ms"]), ms(r["unanchored_step_ms"])))
    click.echo(table(rows))
    click.echo("baseline: the median step outside the profiling window; predicted: the baseline times the "
               f"changed replay over the replay as recorded (sends timed by the link model of {result['link_model']})")
    links = result["link_mbit_s"]
    click.echo("links: " + (", ".join(f"{cls} {rate:g} Mb/s" for cls, rate in links.items()) +
                            " (TCP streams in calibration; a bandwidth scale changes the wire's share of a send)"
                            if links else "rate not measured (a bandwidth scale changes a send's whole time per byte)"))
    pipeline = result.get("pipeline")
    if pipeline:
        was = pipeline["recorded"]
        click.echo(f"pipeline: {was['schedule']} × {was['microbatches']} micro-batches -> {pipeline['schedule']} × "
                   f"{pipeline['microbatches']}: the stages' schedule replayed at {pipeline['modelled_ms']:.1f} -> "
                   f"{pipeline['changed_ms']:.1f} ms; fixed share of the passes "
                   + ", ".join(f"stage {i} {100 * st['fixed_share']:.0f}%" for i, st in enumerate(pipeline["stages"]))
                   + (f" (from {pipeline['fixed_from']})" if pipeline["fitted"] else
                      " (what a kernel or custom op spends whatever its size is not seen in one recording without "
                      "probe steps: more micro-batches err low; --microbatch-run adds a second)"))
    if pipeline and "predicted_range_ms" in result and result["predicted_range_ms"][0] != result["predicted_range_ms"][1]:
        low, high = result["predicted_range_ms"]
        click.echo(f"pipeline: between {low:.1f} and {high:.1f} ms a step, from the ops' fixed cost as seen (time "
                   "between ops, per-op overhead) to all of it: one recording without probe steps does not tell; "
                   "--microbatch-run RUN2 (the job at another micro-batch count) does")
    prefetch = result.get("fsdp_prefetch")
    if prefetch and prefetch["moved_all_gathers"]:
        click.echo(f"fsdp: {prefetch['moved_all_gathers']} forward all-gathers issued {prefetch['forward_prefetch']} "
                   "unit(s) ahead, each waited for where issued (FSDP2's unshard on gloo)")
    units = result.get("fsdp_units")
    if units:
        click.echo(f"fsdp: {units['units']} units as {units['groups']}, {units['calls_dropped']} collective calls "
                   "fewer (their bytes sent by the group's call)")
    mesh = result.get("fsdp_mesh")
    if mesh and "note" not in mesh:
        click.echo(f"fsdp: mesh {mesh['recorded']} -> {mesh['fsdp_mesh']} (replicate x shard): "
                   + (f"gathers and reduce-scatters over {mesh['shard_links']}-host links" if mesh["shard_links"]
                      else "no gathers or reduce-scatters (a shard of one rank)")
                   + (f", each shard's all-reduce over {mesh['replicate_links']}-host links" if mesh["replicate_links"]
                      else ", no all-reduce over replicas")
                   + f" ({mesh['all_reduces_added']} added, {mesh['all_reduces_dropped']} dropped)")
    tp = result.get("tp_mesh")
    if tp and "note" not in tp:
        click.echo(f"tp: mesh {tp['recorded']} -> {tp['tp_mesh']} (dp x tp): {tp['sharded_ops']} ops in tensor-parallel "
                   "regions re-timed for their share of the layer, "
                   + (f"tensor-parallel calls over {tp['tp_links']}-host links" if tp["tp_links"]
                      else f"{tp['tp_calls_dropped']} tensor-parallel calls dropped")
                   + (f", gradients' all-reduces over {tp['dp_links']}-host links ({tp['gradient_calls_resized']} "
                      "of sharded parameters resized)" if tp["dp_links"]
                      else f", {tp['dp_calls_dropped']} gradient all-reduces dropped"))
    slowdown = result["interference"]
    click.echo("interference: " + ("none" if slowdown is None else
                                   f"compute {100 * slowdown['compute']:+.0f}% beside communication, communication "
                                   f"{100 * slowdown['comm']:+.0f}% beside compute (from {slowdown['source']})"))
