"""The links' own rate: the calibration's TCP streams, and the share of a send's time a
bandwidth change scales."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dpro.analysis import RunAnalysis
from dpro.replayer.cost import AlphaBeta
from dpro.replayer.linkmodel import fit_collectives, split_fit, wire_rates
from dpro.run_format import open_run
from dpro.run_records import Calibration

DATA = Path(__file__).parent / "data" / "cpu"


def test_only_the_wires_share_of_a_send_scales_with_the_link() -> None:
    host_bound = AlphaBeta(alpha_ns=1000, beta_bytes_per_ns=0.1, points=5, wire_bytes_per_ns=1.0)
    # 10 ns per byte, of which the wire takes 1: a link 100 times slower adds 99 ns per byte
    assert host_bound.time_ns(1e6, bandwidth_factor=0.01) == pytest.approx(1000 + 1e6 * (9 + 100))
    assert host_bound.time_ns(1e6) == pytest.approx(1000 + 1e6 * 10)
    unknown = AlphaBeta(alpha_ns=1000, beta_bytes_per_ns=0.1, points=5)
    assert unknown.time_ns(1e6, bandwidth_factor=0.01) == pytest.approx(1000 + 1e6 * 1000)
    wire_bound = AlphaBeta(alpha_ns=0, beta_bytes_per_ns=0.1, points=5, wire_bytes_per_ns=0.05)
    assert wire_bound.time_ns(1e6, bandwidth_factor=2) == pytest.approx(1e6 * 5), "never more than all of it"
    # 10 ns a byte where the wire's is 8: TCP's losses on a link it nearly fills are the link's
    nearly_full = AlphaBeta(alpha_ns=0, beta_bytes_per_ns=0.1, points=5, wire_bytes_per_ns=0.125)
    assert nearly_full.time_ns(1e6, bandwidth_factor=2) == pytest.approx(1e6 * 5)


def _stream(src: int, dst: int, windows: list[int]) -> dict:
    return {"src": src, "dst": dst, "bytes": sum(windows), "ns": 50_000_000 * len(windows), "window_ns": 50_000_000,
            "window_bytes": windows}


def test_wire_rates_per_class_from_the_streams_whole_windows() -> None:
    hosts = {0: "a", 1: "a", 2: "b", 3: "b"}
    recovering = [10_000] * 10 + [125_000] * 10 + [1]  # cwnd growing back; the last window is partial
    calibrations = {
        0: {"collectives": {"links": [_stream(3, 0, recovering)]}},
        1: {"collectives": {"links": [_stream(0, 1, [5_000_000] * 10)]}},
        2: {"collectives": {"links": [_stream(1, 2, [125_000] * 20 + [400_000, 1])]}},  # a shaper's first burst
        3: {"collectives": {"links": []}},  # its stream failed
    }
    calibrations = {r: Calibration.from_json(c) for r, c in calibrations.items()}
    rates = wire_rates(calibrations, hosts)
    assert rates["intra"] == pytest.approx(5_000_000 / 50e6)
    assert rates["inter"] == pytest.approx(125_000 / 50e6), "20 Mb/s, neither the recovery nor the burst"


def test_a_recorded_run_times_its_links(recorded_run: Path) -> None:
    analysis = RunAnalysis(open_run(recorded_run))
    rates = wire_rates(analysis.calibrations, analysis.hosts)
    assert set(rates) == {"intra"} and rates["intra"] > 0.01, "two ranks on one host, over loopback"


def test_the_calibration_fit_keeps_the_large_calls_cost_per_byte() -> None:
    """A real calibration through a shaped link: small calls cost more than the line through the
    large ones allows (the shaper), and one fit through every size put the all-reduce and the
    reduce-scatter 16-21% low at 1-16 MiB (the all-gather within 6%); the large sizes now set
    the cost per byte. (Its fixed cost, from the small sizes, overshoots 64-256 KiB calls by up
    to 2.3 times: not asserted here, and not yet mended.)"""
    data = json.loads((DATA / "gloo-4rank-2host-300mbit-calibration.json").read_text())
    calibrations = {int(rank): Calibration.from_json(c) for rank, c in data.items()}
    times: dict[tuple[str, int], list[float]] = {}
    for calibration in calibrations.values():
        for row in calibration.collectives:
            times.setdefault((row.coll, row.size), []).extend(row.times_ns)
    fits = fit_collectives(calibrations)
    for coll in ("all_reduce", "all_gather", "reduce_scatter"):
        for size in (2 ** 20, 2 ** 22, 2 ** 24):
            measured = float(np.median(times[(coll, size)]))
            assert fits[coll].time_ns(size) == pytest.approx(measured, rel=0.10), (coll, size)


def test_split_fit_takes_the_cost_per_byte_from_the_large_sizes() -> None:
    nbytes = np.array([1e3, 1e4, 1e5, 1e6, 1e7, 1e8])
    ns = 5e3 + 2.0 * nbytes
    ns[:2] += 4e4  # small calls slowed (a shaper's latency): the fixed cost, not the bytes'
    fixed, per_byte = split_fit(nbytes, ns)
    assert per_byte == pytest.approx(2.0, rel=1e-6)
    assert fixed == pytest.approx(4.5e4), "the median of the smaller half's time beyond the bytes' cost"
    assert split_fit(nbytes[:2], ns[:2]) == pytest.approx((4.5e4, 2.0)), "too few sizes to split: one line through them"
