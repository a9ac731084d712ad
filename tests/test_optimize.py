"""`dpro optimize`: the passes' proposals on a recorded run, the search and its budgets, the
strategies and their files."""

from __future__ import annotations

import gzip
import json
import re
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpro.analysis import RunAnalysis
from dpro.analysis.cpu_ops import parents, self_ns, top_level
from dpro.analysis.fusion import fused_kernel_durations, fused_shares, fused_time, heavy_kernel, heavy_op
from dpro.analysis.memory import RankMemory, rank_memory
from dpro.analysis.whatif import Change, CostModel, predict
from dpro.errors import DproError
from dpro.graph.kineto import load_trace
from dpro.graph.kineto.allocator import memory_peaks
from dpro.optimizer.memory_estimate import strategy_memory_bytes
from dpro.optimizer.passes import (checkpointing, compression, first_bucket, gradient_accumulation, memory,
                                   operator_fusion, tensor_fusion)
from dpro.optimizer.passes.checkpointing import block_lists
from dpro.optimizer.report import report, with_breakdowns
from dpro.optimizer.report_html import write_html
from dpro.optimizer.search import Tricks, search
from dpro.optimizer.strategy import Strategy, StrategyError, read_strategy
from dpro.run_format import open_run
from dpro.run_records import DdpLayout

from .conftest import DATA, EXAMPLE, SMALL_LM, TORCHRUN, assert_one_line_error, dpro

# every pass searched, whether or not the recorded run happens to expose communication (the
# test job's exposure varies around the 2% under which guidance leaves the communication passes out)
EVERY_PASS = Tricks(guidance=False)


@pytest.fixture(scope="module")
def analysis(recorded_run: Path) -> RunAnalysis:
    return RunAnalysis(open_run(recorded_run))


def test_a_strategy_names_its_change_in_code_and_in_settings() -> None:
    s = Strategy({"bucket_cap_mb": 50, "comm_hook": "powersgd", "powersgd_rank": 2}, ("tensor_fusion", "compression"))
    assert s.name == "bucket-cap-50mb+powersgd-2" and s.lossy
    assert s.change().bucket_cap_mb == 50 and s.change().compress == "powersgd:2"
    assert any("bucket_cap_mb=50" in line for line in s.code())
    assert any("matrix_approximation_rank=2" in line for line in s.code())
    first = Strategy({"first_bucket_mb": 0.25})
    assert first.name == "first-bucket-0.25mb" and not first.lossy and first.change().first_bucket_mb == 0.25
    assert first.code()[0] == "model = DistributedDataParallel(module, ..., bucket_cap_mb_list=[0.25, 25])"
    assert "your bucket_cap_mb" in first.code()[1]
    exact = Strategy({"bucket_cap_mb": 5, "gradient_as_bucket_view": True})
    assert not exact.lossy and exact.change().compress is None and exact.name == "bucket-cap-5mb+grad-as-bucket-view"
    assert exact.code() == ["model = DistributedDataParallel(module, ..., bucket_cap_mb=5, gradient_as_bucket_view=True)"]
    assert Strategy().name == "as-recorded" and Strategy().code() == []
    accumulate = Strategy({"gradient_accumulation": 4, "activation_checkpointing": "blocks"})
    assert accumulate.name == "checkpoint-blocks+accumulate-4" and not accumulate.lossy
    assert accumulate.change().accumulate == 4 and accumulate.change().recompute_forward
    assert "micro_batches = batch.chunk(4)" in accumulate.code() and any("no_sync()" in line for line in accumulate.code())
    compiled = Strategy({"torch_compile": True, "bucket_cap_mb": 5})
    assert compiled.name == "bucket-cap-5mb+torch-compile" and not compiled.lossy and compiled.change().fuse_ops
    assert compiled.code()[1].startswith("model = torch.compile(model)")
    fsdp = Strategy({"fsdp_forward_prefetch": 1, "fsdp_merge_units": 2})
    assert fsdp.name == "forward-prefetch-1+units-of-2" and fsdp.code_change, "grouping units changes the script"
    assert (fsdp.change().forward_prefetch, fsdp.change().merge_units) == (1, 2)
    assert fsdp.code() == ["units[i].set_modules_to_forward_prefetch(units[i + 1:i + 2])  # units: the fully_shard "
                           "modules in forward order, the root first",
                           "for i in range(0, len(blocks), 2): fully_shard(blocks[i:i + 2])  # a list: one FSDP unit "
                           "of them all"]
    assert not Strategy({"fsdp_forward_prefetch": 2}).code_change, "--apply sets the prefetch"


@pytest.mark.parametrize("settings, fragment", [
    ({"bucket_cap": 5}, "unknown strategy setting 'bucket_cap'"),
    ({"bucket_cap_mb": -1}, "positive number"),
    ({"first_bucket_mb": "1"}, "first_bucket_mb must be a positive number"),
    ({"comm_hook": "int8"}, "comm_hook must be one of"),
    ({"comm_hook": "powersgd"}, "powersgd_rank goes with"),
    ({"comm_hook": "powersgd", "powersgd_rank": 0}, "positive integer"),
    ({"gradient_as_bucket_view": "yes"}, "can only be true"),
    ({"gradient_as_bucket_view": False}, "can only be true"),
    ({"activation_checkpointing": "blocks[0]"}, "list of the model's blocks"),
    ({"gradient_accumulation": 1}, "gradient_accumulation must be a number of micro-batches of 2 or more"),
    ({"gradient_accumulation": True}, "gradient_accumulation must be"),
    ({"torch_compile": "max-autotune"}, "torch_compile can only be true"),
    ({"fsdp_forward_prefetch": -1}, "fsdp_forward_prefetch must be a number of units, 0 or more"),
    ({"fsdp_merge_units": 1}, "fsdp_merge_units must be a number of units, 2 or more"),
])
def test_bad_settings_are_refused(settings: dict, fragment: str) -> None:
    with pytest.raises(StrategyError, match=fragment):
        Strategy(settings)


def test_bad_strategy_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(StrategyError, match="cannot read strategy"):
        read_strategy(tmp_path / "missing.json")
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(StrategyError, match="not a strategy file"):
        read_strategy(tmp_path / "list.json")
    (tmp_path / "s.json").write_text(json.dumps({"settings": {"bucket_cap_mb": 5}}))
    assert read_strategy(tmp_path / "s.json").settings == {"bucket_cap_mb": 5}


def test_tensor_fusion_proposes_caps_up_to_one_bucket(analysis: RunAnalysis) -> None:
    caps = [s["bucket_cap_mb"] for s in tensor_fusion(analysis).settings]
    total_mb = sum(analysis.bucket_bytes()) / 2 ** 20
    assert caps[0] == 0.25 and caps[-1] >= total_mb and (len(caps) == 1 or caps[-2] < total_mb), \
        "from a quarter of a MB up to the first cap holding every gradient"


class RecordedLayout:
    """What the tensor fusion pass reads of a run (its DDP layout, bucket sizes), for a layout
    no test job has: 60 MB of gradients under DDP's default 25 MB cap."""

    ddp_layout = DdpLayout.from_meta({"bucket_cap_bytes": 25 * 2 ** 20, "buckets": [{}, {}, {}]})

    def bucket_bytes(self) -> list[int]:
        return [25 * 2 ** 20, 25 * 2 ** 20, 10 * 2 ** 20]


def test_tensor_fusion_leaves_the_recorded_cap_out() -> None:
    caps = [s["bucket_cap_mb"] for s in tensor_fusion(RecordedLayout()).settings]
    assert caps == [0.25, 0.5, 1, 2, 5, 10, 50, 100]


def test_first_bucket_proposes_first_caps_below_the_jobs_cap(analysis: RunAnalysis) -> None:
    explicit = RecordedLayout()  # bucket_cap_mb given: DDP caps the first bucket at the cap too
    explicit.ddp_layout = replace(RecordedLayout.ddp_layout, first_bucket_bytes_cap=25 * 2 ** 20)
    assert [s["first_bucket_mb"] for s in first_bucket(explicit).settings] == [0.25, 1, 5]
    default = RecordedLayout()
    default.ddp_layout = replace(RecordedLayout.ddp_layout, first_bucket_bytes_cap=2 ** 20)
    assert [s["first_bucket_mb"] for s in first_bucket(default).settings] == [0.25, 5], "the recorded first cap left out"
    none = first_bucket(analysis)  # 0.05 MB buckets: no first cap of the ladder is below
    assert not none.settings and "no first cap below the bucket cap (0.05 MB)" in none.why


def test_compression_proposes_the_hooks_the_calibration_timed(analysis: RunAnalysis) -> None:
    proposals = compression(analysis).settings
    assert {"comm_hook": "fp16"} in proposals and {"comm_hook": "bf16"} not in proposals, "bf16 needs NCCL"
    assert {"comm_hook": "powersgd", "powersgd_rank": 2} in proposals


def test_the_memory_pass_proposes_gradients_as_bucket_views_unless_the_job_has_them(analysis: RunAnalysis) -> None:
    assert memory(analysis).settings == [{"gradient_as_bucket_view": True}]

    class Viewing:
        ddp_layout = replace(analysis.ddp_layout, gradient_as_bucket_view=True)

    found = memory(Viewing())
    assert not found.settings and "views into DDP's buckets already" in found.why


def test_the_search_covers_a_small_space_and_ranks_every_strategy(analysis: RunAnalysis) -> None:
    result = search(analysis, budget_s=120)
    assert result.exhaustive and len(result.evaluated) + result.would_fail == result.space
    times = [round(e.predicted_step_ms, 2) for e in result.evaluated]
    assert times == sorted(times)
    names = [e.strategy.name for e in result.evaluated]
    assert "as-recorded" in names and any("+" in n for n in names), "single changes and their combinations"


def test_the_search_keeps_to_its_time_budget(analysis: RunAnalysis) -> None:
    result = search(analysis, budget_s=1e-3)
    assert [e.strategy.name for e in result.evaluated] == ["as-recorded"] and not result.exhaustive


def test_exact_only_leaves_lossy_strategies_out(analysis: RunAnalysis) -> None:
    result = search(analysis, budget_s=120, exact_only=True, tricks=EVERY_PASS)
    assert result.evaluated and not any(e.strategy.lossy for e in result.evaluated)
    assert any(n.startswith("compression: only lossy") for n in result.notes), result.notes


def _html_report(analysis: RunAnalysis, path: Path) -> tuple[dict, list[str]]:
    """The search's report drawn in ``path`` (two strategies beside the recorded configuration),
    and the names of every line that changes the job, in the report's order."""
    result = search(analysis, budget_s=60)
    data = with_breakdowns(report(result, ["torchrun", "train.py"]), result)
    write_html(analysis, data, result.recorded.replayed, {e.strategy.name: e.replayed for e in result.evaluated},
               path, shown=2)
    return data, [s["name"] for s in data["strategies"] + data["code_changes"] if s["apply"]]


def test_the_html_report_splits_each_step_and_shows_each_timeline(analysis: RunAnalysis, tmp_path: Path) -> None:
    data, changing = _html_report(analysis, tmp_path / "report.html")
    html = (tmp_path / "report.html").read_text()
    for category in ("compute", "communication", "waiting", "launch-bound", "idle"):
        assert f'"name":"{category}"' in html
    assert "measured (the profiled window" in html and "predicted: recorded" in html
    assert [name for name in changing if f'"predicted: {name}"' in html] == changing[:2]
    # plotly.js once, beside the page: the page fetches nothing from the network
    [plotly] = tmp_path.glob("plotly-*.min.js")
    assert f"<script src='{plotly.name}'" in html and plotly.stat().st_size > 1e6
    assert not re.findall(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", html), "nothing fetched from the network"
    assert html.index("id='answer'") < html.index("<h2>Strategies") < html.index("<h2>Where the step goes")
    best = data["strategies"][0]
    offered = data["recommendation"]["verdict"] == "change" and bool(best["apply"]) and not best["code_change"]
    assert ("dpro record --apply" in html) == offered, data["recommendation"]  # the run's figures decide which
    assert ("-- torchrun train.py" in html) == offered or "--trial -- torchrun train.py" in html


def test_the_html_report_leads_with_the_answer_in_a_real_browser(analysis: RunAnalysis, tmp_path: Path,
                                                                  browser, capsys) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    data, changing = _html_report(analysis, tmp_path / "report.html")
    browser.get_log("browser")  # what earlier pages said
    browser.set_window_size(1400, 900)
    browser.get((tmp_path / "report.html").as_uri())
    WebDriverWait(browser, 30).until(lambda b: b.execute_script(
        "return Array.from(document.querySelectorAll('.js-plotly-plot')).filter(gd => gd._fullLayout).length == 3"))
    # the first screen holds the answer: the recommendation, or "keep the job as it is"
    answer = browser.execute_script("""const a = document.getElementById('answer'), r = a.getBoundingClientRect();
        return {text: a.innerText, top: r.top, bottom: r.bottom, height: window.innerHeight}""")
    expected = f"Recommended: {data['strategies'][0]['name']}" if data["recommendation"]["verdict"] == "change" \
        else "Keep the job as it is"
    assert expected in answer["text"] and 0 <= answer["top"] and answer["bottom"] <= answer["height"], answer
    figures = browser.execute_script("""return Array.from(document.querySelectorAll('.js-plotly-plot')).map(
        gd => ({names: gd.data.map(t => t.name), bars: gd.querySelectorAll('.bars .point').length,
                points: gd.querySelectorAll('.scatterlayer .point').length,
                titles: Array.from(gd.querySelectorAll('.annotation-text')).map(a => a.textContent)}))""")
    intervals, split, timeline = figures
    assert intervals["points"] == min(10, len(data["strategies"])), "each shown line's prediction is drawn"
    assert sorted(split["names"]) == ["communication", "compute", "idle", "launch-bound", "waiting"]
    assert split["bars"] > 0, "the split's bars are drawn"
    assert timeline["titles"][:2] == ["measured (the profiled window's typical step)", "predicted: recorded"]
    assert timeline["titles"][2:] == [f"predicted: {name}" for name in changing[:2]]
    errors = [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors
    sizes = {p.name: p.stat().st_size for p in tmp_path.iterdir()}
    with capsys.disabled():
        print(f"\noptimize report sizes (bytes): {sizes}")
    assert sizes["report.html"] < 1e6


def test_optimize_writes_its_reports_and_refuses_to_overwrite_them(recorded_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "opt"
    done = dpro("optimize", recorded_run, "--json", "-o", out, "--budget", "120")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    best = data["strategies"][0]
    assert set(best) >= {"name", "passes", "lossy", "predicted_step_ms", "predicted_speedup", "interval_ms", "status",
                         "equivalents", "memory_gb", "change", "apply"}
    assert best["name"] == data["recommendation"]["name"], "the recommendation leads"
    assert best["status"] == ("recommended" if data["recommendation"]["verdict"] == "change" else "as recorded")
    strategy = json.loads((out / "strategy.json").read_text())
    assert strategy["name"] == best["name"] and strategy["settings"] == best["apply"]
    assert read_strategy(out / "strategy.json").name == best["name"]
    markdown = (out / "report.md").read_text()
    assert markdown.startswith("# dpro optimize") and len(markdown.splitlines()) <= 200
    answer = "Recommended: " + best["name"] if data["recommendation"]["verdict"] == "change" else "Keep the job as it is"
    assert markdown.splitlines()[2].startswith(f"**{answer}.**"), "the answer comes first"
    assert "Where the step goes" in (out / "report.html").read_text()
    listed = [line for line in markdown.splitlines() if line.startswith("| ") and line.split(" | ")[0][2:].isdigit()]
    assert len(listed) == min(10, len(data["strategies"])) + min(5, len(data["code_changes"]))
    assert len(list((out / "strategies").glob("*.json"))) == len(data["strategies"]) + len(data["code_changes"])
    text = dpro("optimize", recorded_run, "--budget", "120")
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].startswith(f"{answer}. "), "the answer comes first"
    assert ("apply: dpro record --apply DIR/strategy.json -- " in text.stdout) == (answer != "Keep the job as it is")
    assert lines[-1].startswith("search: ") and "strategies in" in lines[-1]
    again = dpro("optimize", recorded_run, "-o", out)
    assert_one_line_error(again, "already holds a report")
    assert json.loads((out / "report.json").read_text()) == data, "nothing overwritten"


def _record_applying(tmp_path: Path, settings: dict, *job: str):
    strategy = tmp_path / "strategy.json"
    strategy.write_text(json.dumps({"name": "s", "settings": settings, "predicted_step_ms": 1.0}))
    run = tmp_path / "run"
    done = dpro("record", "-o", run, "--skip", "3", "--warmup", "1", "--steps", "1", "--no-calibrate", "--apply", strategy,
                "--", *TORCHRUN, "--nproc-per-node=2", EXAMPLE, "--steps", "6", *SMALL_LM, *job)
    assert done.returncode == 0, done.stderr
    return run, done.stderr


def test_apply_sets_the_bucket_cap_and_hook_of_a_real_job_and_compare_checks_its_prediction(
        tmp_path: Path, recorded_run: Path) -> None:
    run, stderr = _record_applying(tmp_path, {"bucket_cap_mb": 0.5, "comm_hook": "fp16", "gradient_as_bucket_view": True},
                                   "--bucket-cap-mb", "25")
    for rank in (0, 1):
        meta = json.loads((run / "ranks" / str(rank) / "meta.json").read_text())
        assert meta["applied"]["applied"] == ["bucket_cap_mb=0.5 (the script's 25)", "gradient_as_bucket_view=True",
                                              "comm_hook=fp16"]
        ddp = meta["ddp"][0]
        assert ddp["bucket_cap_bytes"] == 2 ** 19 and ddp["comm_hook"] == "fp16_compress_hook"
        assert ddp["gradient_as_bucket_view"] is True
    assert json.loads((run / "run.json").read_text())["options"]["apply"]["settings"]["comm_hook"] == "fp16"
    assert "rank 0: applied bucket_cap_mb=0.5" in stderr
    done = dpro("compare", recorded_run, run, "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["speedup"] == pytest.approx(result["a"]["step_ms"] / result["b"]["step_ms"])
    prediction = result["prediction"]
    assert prediction["strategy"] == "bucket-cap-0.5mb+fp16+grad-as-bucket-view" and prediction["predicted_step_ms"] == 1.0
    assert prediction["error_pct"] == pytest.approx(100 * (1.0 / result["b"]["step_ms"] - 1))
    assert set(result["breakdown"]["a"]) >= {"span", "compute", "communication"}
    text = dpro("compare", recorded_run, run).stdout
    assert "measured speed-up: " in text
    assert "prediction: bucket-cap-0.5mb+fp16+grad-as-bucket-view was predicted at 1.00 ms" in text
    assert "critical path, ms" in text
    assert_one_line_error(dpro("compare", recorded_run, tmp_path / "missing"), "missing")


def test_a_smaller_first_bucket_is_built_as_ddp_builds_it_and_reduced_earlier(tmp_path: Path) -> None:
    whole = tmp_path / "whole"  # DDP's cap of 25 MB given: one bucket holds every gradient
    done = dpro("record", "-o", whole, "--skip", "3", "--warmup", "1", "--steps", "1", "--no-calibrate", "--",
                *TORCHRUN, "--nproc-per-node=2", EXAMPLE, "--steps", "6", *SMALL_LM)
    assert done.returncode == 0, done.stderr
    analysis = RunAnalysis(open_run(whole))
    assert len(analysis.ddp_layout.buckets) == 1
    predicted = CostModel(analysis).predict(Change(first_bucket_mb=0.05))
    assert predicted.summary["reissued"] == 1, "the first bucket's all-reduce now starts at its own last gradient"
    both = predict(analysis, Change(first_bucket_mb=0.05, recompute_forward=True))
    assert both["predicted_step_ms"] > 0 and both["buckets_bytes"] == predicted.summary["buckets_bytes"]
    split, stderr = _record_applying(tmp_path, {"first_bucket_mb": 0.05})
    meta = json.loads((split / "ranks" / "0" / "meta.json").read_text())
    assert meta["applied"]["applied"] == ["bucket_cap_mb_list=[0.05, 25]"]
    ddp = meta["ddp"][0]
    assert ddp["bucket_cap_bytes_list"] == [int(0.05 * 2 ** 20), 25 * 2 ** 20] and ddp["first_bucket_bytes_cap"] == int(0.05 * 2 ** 20)
    assert predicted.summary["buckets_bytes"] == [b["bytes"] for b in ddp["buckets"]], "DDP built the predicted buckets"
    recorded, changed = analysis.graph.collectives, predicted.graph.collectives
    copies = sorted(set(changed["occurrence"]) - set(recorded["occurrence"]))
    assert len(copies) == 1, "the recorded bucket's all-reduce split in two"
    total = analysis.ddp_layout.buckets[0].nbytes
    bucket = int(recorded.query("coll == 'all_reduce' and bytes == @total")["occurrence"].iloc[0])
    first, second = _issuer_start(predicted.graph, copies[0]), _issuer_start(predicted.graph, bucket)
    assert second == _issuer_start(analysis.graph, bucket), "the last bucket is issued where it was"
    assert first < second, "the first bucket is issued by an earlier gradient than the second"
    nodes, replay = predicted.graph.nodes, predicted.replay
    sends = nodes.index[nodes["kind"] == "transfer"]
    for _, on_link in nodes.loc[sends].groupby("resource", observed=True):
        order = on_link.index[replay.start_ns[on_link.index].argsort()]
        assert (replay.start_ns[order[1:]] >= replay.end_ns[order[:-1]] - 1e-6).all(), "a link sends one at a time"


def _issuer_start(graph, occurrence: int) -> float:
    """When rank 0's op that issued all_reduce ``occurrence`` starts."""
    c = graph.collectives.query("coll == 'all_reduce' and occurrence == @occurrence").iloc[0]
    edges, nodes = graph.edges, graph.nodes
    arrivals = edges[edges["dst"].isin(c["done"]) & (edges["kind"] == "arrive")]["src"]
    issuers = edges[edges["dst"].isin(arrivals) & (edges["kind"] == "enqueue")]["src"]
    return float(nodes.loc[issuers][nodes.loc[issuers, "rank"] == 0]["offset_ns"].min())


def test_the_scripts_own_hook_stays_and_a_code_change_is_left_out(tmp_path: Path) -> None:
    run, stderr = _record_applying(tmp_path, {"bucket_cap_mb": 1, "comm_hook": "fp16", "activation_checkpointing": "blocks",
                                              "gradient_accumulation": 2, "torch_compile": True},
                                   "--comm-hook", "powersgd:1")
    meta = json.loads((run / "ranks" / "0" / "meta.json").read_text())
    assert meta["ddp"][0]["comm_hook"] == "powerSGD_hook", "DDP takes one hook: the script's"
    assert meta["applied"]["applied"] == ["bucket_cap_mb=1 (the script's 25)"]
    checkpointing_ = "activation_checkpointing=blocks (a change to the model's code: see the strategy's code)"
    accumulation = "gradient_accumulation=2 (a change to the training loop: see the strategy's code)"
    compiled = "torch_compile=true (the DDP module compiled in the script: see the strategy's code)"
    assert meta["applied"]["left_out"] == [checkpointing_, accumulation, compiled,
                                           "comm_hook=fp16 (the script registered powerSGD_hook)"]
    assert "left out comm_hook=fp16 (the script registered powerSGD_hook)" in stderr
    assert f"left out {checkpointing_}" in stderr


def test_a_hook_ddp_refuses_is_left_out_and_the_job_runs(tmp_path: Path) -> None:
    run, stderr = _record_applying(tmp_path, {"comm_hook": "bf16"})  # bf16 needs CUDA and NCCL; this is gloo
    meta = json.loads((run / "ranks" / "0" / "meta.json").read_text())
    assert meta["ddp"][0]["comm_hook"] is None and meta["applied"]["applied"] == [], "the job ran without"
    assert meta["applied"]["left_out"][0].startswith("comm_hook=bf16: TypeError: BF16")
    assert "left out comm_hook=bf16" in stderr


def test_powersgd_on_gloo_with_several_buckets_is_neither_applied_nor_proposed(tmp_path: Path,
                                                                               analysis: RunAnalysis) -> None:
    run, stderr = _record_applying(tmp_path, {"comm_hook": "powersgd", "powersgd_rank": 1}, "--bucket-cap-mb", "0.05")
    meta = json.loads((run / "ranks" / "0" / "meta.json").read_text())
    assert meta["ddp"][0]["comm_hook"] is None and len(meta["ddp"][0]["buckets"]) > 1, "the job ran without it"
    assert "several buckets on gloo" in meta["applied"]["left_out"][0]
    result = search(analysis, budget_s=120, tricks=EVERY_PASS)  # the recorded job: 0.05 MB buckets, gloo
    for e in result.evaluated:
        if e.strategy.settings.get("comm_hook") == "powersgd":
            assert len(e.prediction.get("buckets_bytes") or analysis.ddp_layout.buckets) == 1, e.strategy.name
    assert any("PowerSGD hook on gloo with more than one bucket" in n for n in result.notes), result.notes


def test_every_node_of_a_run_applies_the_same_strategy(tmp_path: Path) -> None:
    strategy, run = tmp_path / "strategy.json", tmp_path / "run"
    strategy.write_text(json.dumps({"settings": {"bucket_cap_mb": 1}}))
    first = dpro("record", "-o", run, "--apply", strategy, "--", sys.executable, "-c", "pass")  # the first node
    assert first.returncode == 0, first.stderr
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"settings": {"bucket_cap_mb": 5}}))
    done = dpro("record", "--join", "-o", run, "--apply", other, "--", "python", "-c", "pass")
    assert_one_line_error(done, "the run's other nodes apply {'bucket_cap_mb': 1}")
    assert_one_line_error(dpro("record", "--join", "-o", run, "--", "python", "-c", "pass"), "this node none")


@pytest.mark.parametrize("content, fragment", [
    ("{", "cannot read strategy"),
    ('{"settings": {"comm_hook": "int8"}}', "comm_hook must be one of"),
    ('{"name": "x"}', "not a strategy file"),
])
def test_bad_strategy_files_are_one_line_errors_and_record_nothing(tmp_path: Path, content: str, fragment: str) -> None:
    strategy = tmp_path / "strategy.json"
    strategy.write_text(content)
    done = dpro("record", "-o", tmp_path / "run", "--apply", strategy, "--", "python", "-c", "pass")
    assert_one_line_error(done, fragment)
    assert not (tmp_path / "run").exists()


def test_memory_peaks_follow_the_allocator_of_a_public_gpu_trace() -> None:
    trace = DATA / "gpu" / "v100-resnet50-worker0.json.gz"
    events = [e for e in json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"] if e.get("name") == "[memory]"]
    running, top = 0, 0
    for e in sorted((e for e in events if e["args"]["Device Type"] == 1), key=lambda e: e["ts"]):
        running += e["args"]["Bytes"]
        top = max(top, running)
    peaks = {p.device: p for p in memory_peaks(trace)}
    assert set(peaks) == {"cpu", "cuda:0"} and peaks["cuda:0"].added_bytes == top > 2e9
    assert peaks["cuda:0"].allocations == [], "this trace's events name no addresses"
    assert memory_peaks(DATA / "gpu" / "a100-2rank-ddp-rank0.json.gz") == []


def test_the_allocations_held_at_the_peak_are_those_not_yet_freed() -> None:
    """The shapes step of a real H100 run: on the CPU, whose total counts from the profiler's
    start, what is held at the peak is what the step added; on the GPU at least that (a block
    allocated before the trace and freed before the peak lowers the total)."""
    trace = DATA / "runs" / "h100-ddp-1rank" / "ranks" / "0" / "trace-shapes.json.gz"
    peaks = {p.device: p for p in memory_peaks(trace)}
    assert sum(peaks["cpu"].allocations) == peaks["cpu"].added_bytes > 0
    gpu = peaks["cuda:0"]
    assert sum(gpu.allocations) >= gpu.added_bytes > 1e8 and gpu.allocations == sorted(gpu.allocations, reverse=True)
    events = [e["args"] for e in json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
              if e.get("name") == "[memory]" and e["args"]["Device Type"] == 1]
    assert len(gpu.allocations) < sum(e["Bytes"] > 0 for e in events), "the blocks freed before the peak are not held"


def test_the_recorded_run_measures_each_ranks_memory(analysis: RunAnalysis) -> None:
    memory = rank_memory(analysis)
    assert sorted(memory) == analysis.ranks
    for m in memory.values():
        assert m.parameters_bytes == m.gradients_bytes == m.buckets_bytes > 0
        assert m.optimizer_state_bytes >= 2 * m.parameters_bytes  # AdamW: two moments per parameter
        assert m.added_bytes and m.added_bytes > 0 and m.device == "cpu"
        assert m.peak_bytes == 3 * m.parameters_bytes + m.optimizer_state_bytes + m.added_bytes


def test_search_respects_the_memory_budget(analysis: RunAnalysis) -> None:
    recorded = max(m.peak_bytes for m in rank_memory(analysis).values())
    view = recorded - max(m.buckets_bytes for m in rank_memory(analysis).values())
    budget_gb = (recorded + view) / 2 / 1e9  # the buckets' copy of the gradients must go, or activations shrink
    result = search(analysis, budget_s=60, memory_budget_gb=budget_gb, tricks=EVERY_PASS)
    assert result.evaluated and all(e.memory_bytes <= budget_gb * 1e9 for e in result.evaluated)
    assert all(e.strategy.settings.get("gradient_as_bucket_view") or e.strategy.settings.get("gradient_accumulation")
               for e in result.evaluated)
    assert any(not e.strategy.settings.get("gradient_accumulation") for e in result.evaluated)
    assert result.over_memory_budget > 0 and any("over the" in n for n in result.notes)
    unbounded = search(analysis, budget_s=60, tricks=EVERY_PASS)
    assert any(not e.strategy.settings for e in unbounded.evaluated)
    assert max(e.memory_bytes for e in unbounded.evaluated) > budget_gb * 1e9
    too_small = dpro("optimize", analysis.root, "--memory-budget", str(view / 2 / 1e9))
    assert_one_line_error(too_small, "no strategy fits in")


def test_activation_checkpointing_recomputes_the_forward_pass_in_the_backward(analysis: RunAnalysis) -> None:
    # without interference, so that only the recomputation moves the step
    as_recorded = predict(analysis, Change(), interference=False)
    checkpointed = predict(analysis, Strategy({"activation_checkpointing": "blocks"}).change(), interference=False)
    recompute = checkpointed["recompute"]["cpu"]
    assert recompute["forward_ms"] > 0 and recompute["backward_ms"] > 0
    assert checkpointed["unanchored_step_ms"] > as_recorded["unanchored_step_ms"]
    # by at most the forward pass recomputed on the rank where it is longest
    assert checkpointed["unanchored_step_ms"] <= as_recorded["unanchored_step_ms"] + recompute["largest_forward_ms"] * 1.05


def test_gradient_accumulation_pays_each_ops_fixed_cost_per_micro_batch(analysis: RunAnalysis) -> None:
    assert gradient_accumulation(analysis).settings == [{"gradient_accumulation": k} for k in (2, 4)]
    as_recorded = predict(analysis, Change(), interference=False)
    steps = {k: predict(analysis, Change(accumulate=k), interference=False) for k in (2, 4)}
    recorded_backward = predict(analysis, Change(recompute_forward=True))["recompute"]["cpu"]["backward_ms"]
    for k, predicted in steps.items():
        cpu = predicted["accumulation"]["cpu"]
        assert predicted["accumulation"]["micro_batches"] == k and 0 < cpu["fixed_share"] < 1
        # a micro-batch's backward pass takes more than 1/k of the recorded one, less than all of it
        assert recorded_backward / k < cpu["micro_batch_backward_ms"] < recorded_backward
    assert as_recorded["unanchored_step_ms"] < steps[2]["unanchored_step_ms"] < steps[4]["unanchored_step_ms"]
    with pytest.raises(DproError, match="2 micro-batches or more"):
        predict(analysis, Change(accumulate=1))


def test_operator_fusion_keeps_the_heavy_ops_and_fuses_the_chains_between_them(analysis: RunAnalysis) -> None:
    assert operator_fusion(analysis).settings == [{"torch_compile": True}]
    for r in analysis.ranks:
        shares = fused_shares(analysis, r)
        assert shares.chains > 0 and shares.ops > shares.chains
        assert 0 < shares.forward < 1 and 0 < shares.backward < 1
    as_recorded = CostModel(analysis, interference=False).predict(Change())
    fused = CostModel(analysis, interference=False).predict(Change(fuse_ops=True))
    cpu = fused.summary["fusion"]["cpu"]
    assert 0 < cpu["forward_share"] < 1 and 0 < cpu["backward_share"] < 1
    # the step shortens, by at most the time fusion took off the ops of the rank it took most from
    taken = pd.Series(as_recorded.graph.nodes["dur_ns"].to_numpy() - (fused.replay.end_ns - fused.replay.start_ns))
    most = taken.groupby(as_recorded.graph.nodes["rank"].to_numpy()).sum().max() / 1e6
    gain = as_recorded.summary["unanchored_step_ms"] - fused.summary["unanchored_step_ms"]
    assert 0 < gain <= most * 1.01


def test_matrix_products_and_library_kernels_stay_and_the_rest_fuses() -> None:
    assert heavy_op("aten::addmm") and heavy_op("aten::_scaled_dot_product_flash_attention_for_cpu_backward")
    assert heavy_op("aten::mkldnn_convolution") and heavy_op("aten::convolution_backward")
    assert not heavy_op("aten::gelu") and not heavy_op("aten::native_layer_norm") and not heavy_op("aten::linear")
    # custom ops are opaque to the compiler: nothing fuses into them
    assert heavy_op("dpro_testbed::hold") and heavy_op("c10d::allreduce_") and not heavy_op("autograd::engine::x")
    events = load_trace(DATA / "gpu" / "a100-2rank-ddp-rank0.json.gz", cache=False).events  # a public A100 trace
    kernels = events[events["cat"] == "kernel"].reset_index(drop=True)
    names = kernels["name"].astype(str).to_numpy()
    heavy = np.array([heavy_kernel(n) for n in names])
    assert heavy[np.char.find(names.astype(str), "gemm") >= 0].all()
    assert not heavy[np.char.find(names.astype(str), "elementwise") >= 0].any()
    dur = kernels["dur_ns"].to_numpy(np.float64)
    fused = fused_kernel_durations(names, kernels["stream"].to_numpy(), kernels["start_ns"].to_numpy(np.float64), dur,
                                   np.ones(len(names), bool))
    assert 0.2 * dur.sum() < fused.sum() < dur.sum()
    # a run of fusable kernels on one stream takes its longest kernel's time, scaled alike;
    # a heavy kernel, another stream and a kernel left out of the members each end a run
    toy = fused_kernel_durations(np.array(["elementwise", "reduce", "gemm", "elementwise", "elementwise", "relu", "add"]),
                                 np.array([1, 1, 1, 1, 2, 2, 2]), np.arange(7.0),
                                 np.array([3.0, 1.0, 9.0, 2.0, 2.0, 4.0, 4.0]), np.array([1, 1, 1, 1, 1, 0, 1], bool))
    assert toy.tolist() == [2.25, 0.75, 9.0, 2.0, 2.0, 4.0, 4.0]


def test_the_fused_time_of_a_pass() -> None:
    # gelu, add | mm | layer_norm, (next step) add: two chains in step 0, one in step 1
    heavy = np.array([False, False, True, False, False])
    dur = np.array([50.0, 30.0, 400.0, 60.0, 20.0])
    own = np.array([50.0, 30.0, 100.0, 60.0, 20.0])
    total, chains, calls = fused_time(heavy, dur, own, 10.0, np.array([0, 0, 0, 0, 1]))
    assert (total, chains, calls) == ((10 + 40) + 400 + (10 + 50) + (10 + 10), 3, 4)
    assert fused_time(heavy, dur, own, 10.0, np.zeros(5))[:2] == ((10 + 40) + 400 + (10 + 50), 2)


def test_nesting_of_cpu_ops() -> None:
    # thread 1: linear [0, 100) holding t [0, 10) and addmm [10, 90) holding empty [20, 25); relu [100, 120)
    # thread 2: an op overlapping linear in time, but on its own thread
    cpu = pd.DataFrame({"tid": [1, 1, 1, 1, 1, 2], "start_ns": [0, 0, 10, 20, 100, 5],
                        "dur_ns": [100, 10, 80, 5, 20, 50]})
    cpu = cpu.assign(end_ns=cpu["start_ns"] + cpu["dur_ns"])
    parent = parents(cpu)
    assert parent.tolist() == [-1, 0, 0, 2, -1, -1]
    assert self_ns(cpu, parent).tolist() == [10, 10, 75, 5, 20, 50]
    top, owner = top_level(cpu)
    assert top.tolist() == [True, False, False, False, True, True] and owner.tolist() == [0, 0, 0, 0, 4, 5]


def test_the_example_accumulates_gradients_with_one_all_reduce_a_step(tmp_path: Path) -> None:
    run = tmp_path / "run"
    done = dpro("record", "-o", run, "--skip", "3", "--warmup", "1", "--steps", "1", "--no-calibrate", "--",
                *TORCHRUN, "--nproc-per-node=2", EXAMPLE, "--steps", "6", *SMALL_LM, "--accumulate", "2")
    assert done.returncode == 0, done.stderr
    analysis = RunAnalysis.open(run)
    names = analysis.graph.nodes.query("rank == 0")["name"].astype(str)
    assert (names == "DistributedDataParallel.forward").sum() == 2, "two micro-batches, each a forward pass"
    assert len(analysis.graph.collectives.query("coll == 'all_reduce'")) == len(analysis.bucket_bytes())


class Layers:
    """A DDP layout of a model with two parallel lists of eight blocks (a CNN's convolutions
    and their norms) and a list nested inside each block."""

    ddp_layout = DdpLayout.from_meta({"bucket_cap_bytes": 25 * 2 ** 20, "buckets": [
        {"bytes": 4 * 8240, "params": [{"name": f"convs.{i}.weight", "numel": 1000} for i in range(8)]
         + [{"name": f"norms.{i}.weight", "numel": 10} for i in range(8)]
         + [{"name": f"convs.{i}.inner.{j}.bias", "numel": 1} for i in range(8) for j in range(20)]}]})


def test_checkpointing_takes_the_longest_outermost_list_of_blocks(analysis: RunAnalysis) -> None:
    assert block_lists(Layers.ddp_layout) == {"convs": (8, 8160), "norms": (8, 80)}
    assert checkpointing(Layers()).settings == [{"activation_checkpointing": "convs"}]
    one = checkpointing(analysis)  # the test job has a single block
    assert not one.settings and "no list of two blocks" in one.why


def test_the_memory_estimate_of_each_setting() -> None:
    held = RankMemory(parameters_bytes=100, gradients_bytes=100, buckets_bytes=100, gradient_as_bucket_view=False,
                      optimizer_state_bytes=200, added_bytes=800, device="cpu")
    assert held.peak_bytes == 1300
    memory = {0: held}
    assert strategy_memory_bytes({}, memory, Layers.ddp_layout) == 1300
    assert strategy_memory_bytes({"gradient_as_bucket_view": True}, memory, Layers.ddp_layout) == 1200
    assert strategy_memory_bytes({"activation_checkpointing": "convs"}, memory, Layers.ddp_layout) == 1300 - 600
    assert strategy_memory_bytes({"comm_hook": "powersgd", "powersgd_rank": 1}, memory, None) == 1400
    assert strategy_memory_bytes({"comm_hook": "fp16"}, memory, Layers.ddp_layout) == 1300 + 2 * 8240
    assert strategy_memory_bytes({"gradient_accumulation": 4}, memory, Layers.ddp_layout) == 1300 - 600
    assert strategy_memory_bytes({"gradient_accumulation": 2, "activation_checkpointing": "convs"}, memory,
                                 Layers.ddp_layout) == 1300 - 600 - 100
    assert strategy_memory_bytes({}, {}, Layers.ddp_layout) is None


def test_each_speed_up_trick_can_be_switched_off_and_changes_no_prediction(analysis: RunAnalysis) -> None:
    on = search(analysis, budget_s=120)
    full_replays = search(analysis, budget_s=120, tricks=Tricks(incremental=False))
    assert {e.strategy.name: e.predicted_step_ms for e in full_replays.evaluated} == \
        pytest.approx({e.strategy.name: e.predicted_step_ms for e in on.evaluated}, rel=1e-9)
    unguided = search(analysis, budget_s=120, tricks=Tricks(guidance=False))
    assert unguided.space >= on.space and not any("left out, communication is exposed" in n for n in unguided.notes)
    assert report(unguided)["search"]["tricks"] == {"guidance": False, "incremental": True, "fold": False}
