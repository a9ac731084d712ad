"""`dpro optimize` recommends only what it can show: intervals from held-out errors, equivalent
strategies collapsed, code changes apart, reports drawn from the search's own predictions, and
measured trials of real jobs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpro.analysis import RunAnalysis
from dpro.analysis.whatif import CostModel, Prediction
from dpro.optimizer.report import markdown, report, with_breakdowns, write_report
from dpro.optimizer.search import Evaluated, SearchResult, search
from dpro.optimizer.strategy import Strategy
from dpro.optimizer.trials import Trial, run_trials
from dpro.optimizer.uncertainty import Interval, interval
from dpro.run_format import open_run

from .conftest import JOBS, TORCHRUN, dpro

TRIAL_JOB = [*TORCHRUN, "--nproc-per-node=2", str(JOBS / "trial_job.py")]


def _result(baseline: float, predicted: dict[str, tuple[dict, float]]) -> SearchResult:
    """A search's result with the given predictions (name: settings, predicted ms) and the
    recorded configuration at ``baseline``: the recommendation's rules on their own. (The
    predictions carry no timeline: these tests never draw one.)"""
    def evaluated(settings: dict, ms: float) -> Evaluated:
        return Evaluated(Strategy(settings), Prediction({"predicted_step_ms": ms}, None, None))  # type: ignore[arg-type]

    recorded = evaluated({}, baseline)
    return SearchResult(baseline, [recorded] + [evaluated(s, ms) for s, ms in predicted.values()], recorded=recorded)


def test_the_interval_comes_from_the_held_out_errors_of_the_changes_family() -> None:
    bucket = interval(Strategy({"bucket_cap_mb": 1}), 100.0)
    assert bucket.families == ("buckets",) and bucket.low_ms < 100 < bucket.high_ms
    both = interval(Strategy({"bucket_cap_mb": 1, "comm_hook": "fp16"}), 100.0)
    assert both.low_ms < bucket.low_ms and both.high_ms > bucket.high_ms, "two families add their errors"
    assert interval(Strategy({"static_graph": True}), 100.0) == Interval(100.0, 100.0, ()), "kept as recorded"
    assert interval(Strategy({"torch_compile": True}), 50.0) is None, "no held-out case scores torch.compile"


def test_a_strategy_inside_its_interval_is_not_recommended() -> None:
    bucket = interval(Strategy({"bucket_cap_mb": 1}), 95.0)
    assert bucket.high_ms > 100, "a 5% gain is inside the bucket family's interval"
    data = report(_result(100.0, {"small gain": ({"bucket_cap_mb": 1}, 95.0)}))
    assert data["recommendation"]["verdict"] == "keep" and data["strategies"][0]["name"] == "as-recorded"
    assert "bucket-cap-1mb" in data["recommendation"]["why"]
    assert [s["status"] for s in data["strategies"]] == ["as recorded", "unproven"]
    data = report(_result(100.0, {"large gain": ({"bucket_cap_mb": 1}, 70.0)}))
    assert data["recommendation"] == {**data["recommendation"], "verdict": "change", "name": "bucket-cap-1mb"}
    assert data["strategies"][0]["status"] == "recommended" and data["strategies"][0]["speedup_interval"][0] > 1


def test_equivalent_strategies_are_one_line_the_cheapest_first() -> None:
    data = report(_result(100.0, {
        "views": ({"gradient_as_bucket_view": True}, 100.0), "static": ({"static_graph": True}, 100.0),
        "cap": ({"bucket_cap_mb": 1}, 70.0), "cap+views": ({"bucket_cap_mb": 1, "gradient_as_bucket_view": True}, 70.0),
        "cap 2": ({"bucket_cap_mb": 2}, 71.0), "fp16": ({"comm_hook": "fp16"}, 71.0)}))
    lines = {s["name"]: s["equivalents"] for s in data["strategies"]}
    assert set(lines) == {"bucket-cap-1mb", "fp16", "as-recorded"}, "lossy fp16 stays apart from the exact caps"
    assert lines["bucket-cap-1mb"] == ["bucket-cap-1mb+grad-as-bucket-view", "bucket-cap-2mb"]
    assert sorted(lines["as-recorded"]) == ["grad-as-bucket-view", "static-graph"]


def test_code_changes_are_listed_apart_and_never_recommended() -> None:
    data = report(_result(100.0, {"accumulate": ({"gradient_accumulation": 2}, 40.0),
                                  "compile": ({"torch_compile": True}, 30.0)}))
    assert data["recommendation"]["verdict"] == "keep"
    assert [s["name"] for s in data["strategies"]] == ["as-recorded"]
    apart = {s["name"]: s for s in data["code_changes"]}
    assert apart["torch-compile"]["status"] == "unscored" and apart["torch-compile"]["interval_ms"] is None
    assert apart["accumulate-2"]["interval_ms"] is not None


def test_the_reports_draw_the_searchs_own_predictions(recorded_run: Path, tmp_path: Path, monkeypatch) -> None:
    analysis = RunAnalysis(open_run(recorded_run))
    result = search(analysis, budget_s=60)
    data = with_breakdowns(report(result), result)

    def predicts_again(*args, **kwargs):
        raise AssertionError("the report predicted again")

    monkeypatch.setattr(CostModel, "__init__", predicts_again)
    monkeypatch.setattr(Prediction, "of", predicts_again)
    write_report(data, result, tmp_path, analysis)
    html = (tmp_path / "report.html").read_text()
    shown = [s["name"] for s in data["strategies"] + data["code_changes"] if s["apply"]][:4]
    assert all(f'"predicted: {name}"' in html for name in shown)
    assert set(data["breakdowns"]) == {"as-recorded", *shown}, "the split drawn from the same predictions"
    # report.md lists the best 10 distinct lines and 5 code changes; --all lists every one
    write_report(data, result, tmp_path / "all", analysis, every=True)
    for folder, lines, apart in ((tmp_path, 10, 5), (tmp_path / "all", None, None)):
        rows = [r.split(" | ")[1] for r in (folder / "report.md").read_text().splitlines()
                if r.startswith("| ") and r.split(" | ")[0][2:].isdigit()]
        assert rows == [s["name"] for s in data["strategies"][:lines] + data["code_changes"][:apart]]
    # a search with many distinct lines (this small job folds into a few): the default leaves the rest out
    many = {**data, "strategies": [dict(data["strategies"][0], name=f"line-{i}") for i in range(400)]}
    text = markdown(many)
    assert "390 more in report.json" in text and len(text.splitlines()) <= 200
    assert len(markdown(many, every=True).splitlines()) > 400


def test_trial_measures_the_candidates_and_recommends_the_measured_best(tmp_path: Path) -> None:
    run = tmp_path / "run"
    done = dpro("record", "-o", run, "--skip", "4", "--warmup", "1", "--steps", "2", "--",
                *TRIAL_JOB, "--steps", "12")
    assert done.returncode == 0, done.stderr
    out = tmp_path / "report"
    done = dpro("optimize", run, "--trial", "--trials", "2", "--trial-steps", "5", "--trial-rounds", "1", "--json",
                "-o", out, "--", *TRIAL_JOB, "--steps", "60")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    results = {r["name"]: r for r in data["trials"]["results"]}
    assert len(results) == 3 and "as-recorded" in results
    measured = [r for r in results.values() if r["median_ms"]]
    assert len(measured) >= 2 and all(r["failed"] for r in results.values() if r not in measured), results
    fastest = min(measured, key=lambda r: r["median_ms"])
    assert data["recommendation"]["name"] == fastest["name"] and data["recommendation"]["by"] == "trials"
    assert json.loads((out / "strategy.json").read_text())["name"] == fastest["name"]
    assert (out / "trials" / "as-recorded-round1").is_dir()
    assert "Measured trials" in (out / "report.md").read_text()


def test_a_trial_that_fails_or_hangs_is_stopped_and_reported_and_the_rest_go_on(tmp_path: Path) -> None:
    trials = [Trial("as-recorded", {}), Trial("static-graph", {"static_graph": True}),
              Trial("first-bucket-1mb", {"first_bucket_mb": 1}), Trial("bucket-cap-1mb", {"bucket_cap_mb": 1})]
    run_trials([*TRIAL_JOB, "--steps", "40"], trials, tmp_path, steps=4, rounds=2, timeout_s=20)
    baseline, failing, hanging, faster = trials
    assert "exited with" in failing.failed and not failing.measured_ms
    assert "stopped after 20 s" in hanging.failed and not hanging.measured_ms
    assert len(baseline.measured_ms) == len(faster.measured_ms) == 2, "the others ran both rounds"
    assert faster.median_ms < baseline.median_ms, "20 ms less a step under a bucket cap of 1 MB"


@pytest.mark.parametrize("args, fragment", [(["--trial"], "needs the job's command"),
                                            (["--", "python", "train.py"], "unexpected arguments")])
def test_trial_arguments_are_checked(recorded_run: Path, args: list[str], fragment: str) -> None:
    from .conftest import assert_one_line_error

    assert_one_line_error(dpro("optimize", recorded_run, *args), fragment)


def test_tune_records_the_job_searches_it_and_measures_the_candidates(tmp_path: Path) -> None:
    out = tmp_path / "tuned"
    done = dpro("tune", "-o", out, "--skip", "4", "--steps", "2", "--trials", "1", "--trial-steps", "3",
                "--trial-rounds", "1", "--", *TRIAL_JOB, "--steps", "14")
    assert done.returncode == 0, done.stderr
    assert (out / "run" / "run.json").exists(), "the baseline recorded into DIR/run"
    assert "trials (3 steps each, 1 interleaved rounds):" in done.stdout
    assert done.stdout.splitlines()[0].startswith(("Recommended: ", "Keep the job as it is. ")), done.stdout
    again = dpro("tune", "-o", out, "--", *TRIAL_JOB)
    assert again.returncode != 0 and "already holds a report" in again.stderr
