"""``dpro dashboard`` on a run of about a million events: the time to first paint of the
timeline, the time of each zoom, and the bytes sent to the browser per view.

The run is :mod:`benchmarks.synthetic_runs`' copies of one real A100 trace, 38 ranks of 26,932
events (1,023,416 events, 1,023,302 of them ops; the rest are step spans). The dashboard runs
as users start it (``dpro dashboard RUN``, its own process, which loads the run before it
listens: that start-up is timed apart); a real headless Chromium opens it:

- **first paint**: from asking for ``/timeline`` to its ops drawn in the page (plotly's bars
  in the DOM), :data:`REPEATS` fresh loads; goal <= 3 s;
- **zoom**: the window set to a tenth, a hundredth, a thousandth of the step and back out
  (plotly's ``relayout``, the event a zoom box or the scroll wheel makes), from the event to
  the new window's shapes drawn; goal <= 0.5 s each;
- **bytes per view**: the JSON of each callback's answer (``_dash-update-component``), from the
  browser's resource timing. The baseline is what sending every op in view would take, at the
  bytes per op the fully detailed views measured in this run.

    python -m benchmarks dashboard [--quick]
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dpro.cli.options import table
from tools.testing.browser import headless_chromium, start_dashboard

from benchmarks.synthetic_runs import make_run

RANKS = 38  # 38 x 26,932 events: just over a million
REPEATS = 5
GOAL_FIRST_PAINT_S = 3.0
GOAL_ZOOM_S = 0.5
ZOOMS = [("a tenth", 0.1), ("a hundredth", 0.01), ("a thousandth", 0.001), ("back out", 1.0)]
_DRAWN = "return document.querySelectorAll('#timeline .barlayer .point').length > 0"
_STATUS = "return (document.getElementById('timeline-status') || {}).textContent || ''"


def run(quick: bool = False) -> list[dict]:
    repeats = 2 if quick else REPEATS
    with tempfile.TemporaryDirectory(prefix="dpro-bench-dashboard-") as folder:
        print(f"dashboard: writing a {RANKS}-rank run", file=sys.stderr, flush=True)
        run_dir = make_run(Path(folder) / "run", RANKS)
        _warm(run_dir)
        started = time.perf_counter()
        server, url = start_dashboard(str(run_dir))
        try:
            startup_s = time.perf_counter() - started
            paints, zooms, sent = _measure(url, repeats)
        finally:
            server.terminate()
            server.wait(timeout=60)
    return _report(startup_s, paints, zooms, sent, repeats)


def _warm(run_dir: Path) -> None:
    """Decode the traces and build the graph once (what a first ``dpro`` command on the run
    does), so that the start-up timed is the dashboard's own."""
    subprocess.run([sys.executable, "-m", "dpro", "replay", str(run_dir)], check=True, capture_output=True)


def _measure(url: str, repeats: int) -> tuple[list[float], dict[str, list[float]], list[dict]]:
    from selenium.webdriver.support.ui import WebDriverWait

    browser = headless_chromium()
    try:
        paints = []
        for _ in range(repeats):
            browser.get("about:blank")
            began = time.perf_counter()
            browser.get(url + "/timeline")
            WebDriverWait(browser, 60, poll_frequency=0.01).until(lambda b: b.execute_script(_DRAWN))
            paints.append(time.perf_counter() - began)
        sent = [_last_answer(browser, "first paint (the page with its timeline)")]
        end_ms = browser.execute_script("return document.querySelector('#timeline .js-plotly-plot').layout.xaxis.range[1]")
        zooms: dict[str, list[float]] = {name: [] for name, _ in ZOOMS}
        for i in range(repeats):
            for name, share in ZOOMS:
                status = browser.execute_script(_STATUS)
                middle = end_ms / 2 + i * end_ms / 97  # a different window each round
                half = end_ms * share / 2
                window = [0, end_ms] if share == 1.0 else [middle - half, middle + half]
                began = time.perf_counter()
                browser.execute_script("Plotly.relayout(document.querySelector('#timeline .js-plotly-plot'), "
                                       "{'xaxis.range': arguments[0]})", window)
                WebDriverWait(browser, 60, poll_frequency=0.01).until(
                    lambda b: b.execute_script(_STATUS) != status and b.execute_script(_DRAWN))
                zooms[name].append(time.perf_counter() - began)
                if i == 0:
                    sent.append(_last_answer(browser, f"zoom to {name}"))
        return paints, zooms, sent
    finally:
        browser.quit()


def _last_answer(browser, view: str) -> dict:
    """The bytes of the last callback answer, and what the page said it drew."""
    size = browser.execute_script(
        "const e = performance.getEntriesByType('resource').filter(r => r.name.includes('_dash-update-component'));"
        "return e.length ? e[e.length - 1].encodedBodySize : 0;")
    status = browser.execute_script(_STATUS)
    ops, shapes = (int(part.split()[0].replace(",", "")) for part in status.split(";")[:2])
    return {"view": view, "bytes": size, "ops": ops, "shapes": shapes, "merged": "merged" in status}


def _report(startup_s: float, paints: list[float], zooms: dict[str, list[float]], sent: list[dict],
            repeats: int) -> list[dict]:
    detailed = [s for s in sent if not s["merged"] and s["ops"]]
    per_op = statistics.median(s["bytes"] / s["ops"] for s in detailed) if detailed else float("nan")
    print(f"dpro dashboard on {RANKS} ranks, about a million events ({repeats} repeats; medians and ranges); "
          f"start-up (loading the run, graph already built) {startup_s:.1f} s")
    print(table([("view", "seconds", "goal", "met")] +
                [("first paint of /timeline", _spread(paints), f"<= {GOAL_FIRST_PAINT_S}",
                  "yes" if statistics.median(paints) <= GOAL_FIRST_PAINT_S else "NO")] +
                [(f"zoom to {name}", _spread(times), f"<= {GOAL_ZOOM_S}",
                  "yes" if statistics.median(times) <= GOAL_ZOOM_S else "NO") for name, times in zooms.items()]))
    print(table([("view", "ops in view", "shapes sent", "bytes sent", "bytes if every op were sent")] +
                [(s["view"], f"{s['ops']:,}", f"{s['shapes']:,}", f"{s['bytes']:,}", f"{s['ops'] * per_op:,.0f}")
                 for s in sent]))
    print(f"(every op sent costs {per_op:.0f} bytes, the median of the views that sent every op)")
    rows = [{"benchmark": "dashboard", "case": f"{RANKS} ranks, ~1M events", "metric": "first paint of the timeline (s)",
             "dpro": statistics.median(paints), "baseline": GOAL_FIRST_PAINT_S,
             "ratio": statistics.median(paints) / GOAL_FIRST_PAINT_S, "goal": f"<= {GOAL_FIRST_PAINT_S} s",
             "met": statistics.median(paints) <= GOAL_FIRST_PAINT_S}]
    for name, times in zooms.items():
        rows.append({"benchmark": "dashboard", "case": f"{RANKS} ranks, ~1M events", "metric": f"zoom to {name} (s)",
                     "dpro": statistics.median(times), "baseline": GOAL_ZOOM_S,
                     "ratio": statistics.median(times) / GOAL_ZOOM_S, "goal": f"<= {GOAL_ZOOM_S} s",
                     "met": statistics.median(times) <= GOAL_ZOOM_S})
    for s in sent:
        every = s["ops"] * per_op
        rows.append({"benchmark": "dashboard", "case": f"{RANKS} ranks, ~1M events", "metric": f"bytes sent: {s['view']} "
                     "(baseline: every op in view)", "dpro": s["bytes"], "baseline": every,
                     "ratio": s["bytes"] / every if every else float("nan"), "goal": "(measured, no goal)", "met": True})
    return rows


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


if __name__ == "__main__":
    run(quick="--quick" in sys.argv)
