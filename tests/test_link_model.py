"""The links' own rate: the calibration's TCP streams, and the share of a send's time a
bandwidth change scales."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpro.analysis import RunAnalysis
from dpro.replayer.cost import AlphaBeta
from dpro.replayer.linkmodel import wire_rates
from dpro.run_format import open_run
from dpro.run_records import Calibration


def test_only_the_wires_share_of_a_send_scales_with_the_link() -> None:
    host_bound = AlphaBeta(alpha_ns=1000, beta_bytes_per_ns=0.1, points=5, wire_bytes_per_ns=1.0)
    # 10 ns per byte, of which the wire takes 1: a link 100 times slower adds 99 ns per byte
    assert host_bound.time_ns(1e6, bandwidth_factor=0.01) == pytest.approx(1000 + 1e6 * (9 + 100))
    assert host_bound.time_ns(1e6) == pytest.approx(1000 + 1e6 * 10)
    unknown = AlphaBeta(alpha_ns=1000, beta_bytes_per_ns=0.1, points=5)
    assert unknown.time_ns(1e6, bandwidth_factor=0.01) == pytest.approx(1000 + 1e6 * 1000)
    wire_bound = AlphaBeta(alpha_ns=0, beta_bytes_per_ns=0.1, points=5, wire_bytes_per_ns=0.05)
    assert wire_bound.time_ns(1e6, bandwidth_factor=2) == pytest.approx(1e6 * 5), "never more than all of it"


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
