"""What a raw counter is: its canonical name, unit, scale, bit width, and whether it saturates.

Sources: ``rdma`` (``ports/<n>/counters``: the InfiniBand PMA counters), ``rdma_hw``
(``ports/<n>/hw_counters``: driver counters), ``netdev`` (``class/net/<if>/statistics``),
``ethtool`` (``ethtool -S``) and ``gpu`` (NVML field values).

Canonical names let one rule read every vendor: mlx5's ``rx_pause_ctrl_phy``, Broadcom's
``rx_pause_frames`` and Intel ice's ``link_xoff_rx.nic`` are all ``rx_pause_frames``. Counters
without a canonical name keep their raw name only.

Widths (see :mod:`dpro.collectors.counters.wrap` for how a decrease is read):

* PMA counters, from the kernel's ``PORT_PMA_ATTR`` table: the error counters are 4 to 16 bits,
  ``port_xmit_wait`` 32; the data and packet counters are 32 bits in the basic PortCounters and
  64 in PortCountersExtended, which every ConnectX uses. PMA counters saturate at their maximum
  (InfiniBand spec) instead of wrapping.
* mlx5 ``hw_counters``: the Q counters (``out_of_buffer``, ``out_of_sequence``,
  ``local_ack_timeout_err``...) are 32-bit hardware counters that wrap; the congestion counters
  (``np_cnp_sent``, ``rp_cnp_handled``...) and ``rx_icrc_encapsulated`` are 64-bit.
* mlx5 ``ethtool -S``: ``rx_out_of_buffer`` and ``rx_if_down_packets`` come from the same 32-bit Q
  counters; the rest are 64-bit.
* Everything else (netdev statistics on a 64-bit kernel, other vendors, NVML fields): 64 bits.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Names in counter directories that are settings, not counters.
NOT_COUNTERS = {("rdma_hw", "lifespan")}  # mlx5: how long (ms) the driver caches hw_counters


@dataclass(frozen=True)
class CounterInfo:
    """Metadata of one raw counter; ``value_in_unit = raw * scale``."""

    canonical: str | None
    unit: str = "count"
    scale: int = 1
    width: int = 64
    saturates: bool = False


def _pma(canonical: str, width: int, unit: str = "count", scale: int = 1) -> CounterInfo:
    return CounterInfo(canonical, unit, scale, width, saturates=True)


_RDMA = {
    "symbol_error": _pma("symbol_errors", 16),
    "link_error_recovery": _pma("link_recoveries", 8),
    "link_downed": _pma("link_down_events", 8),
    "port_rcv_errors": _pma("rx_errors", 16),
    "port_rcv_remote_physical_errors": _pma("rx_remote_physical_errors", 16),
    "port_rcv_switch_relay_errors": _pma("rx_switch_relay_errors", 16),
    "port_xmit_discards": _pma("tx_discards", 16),
    "port_xmit_constraint_errors": _pma("tx_constraint_errors", 8),
    "port_rcv_constraint_errors": _pma("rx_constraint_errors", 8),
    "local_link_integrity_errors": _pma("link_integrity_errors", 4),
    "excessive_buffer_overrun_errors": _pma("buffer_overruns", 4),
    "VL15_dropped": _pma("vl15_drops", 16),
    "port_xmit_wait": _pma("tx_wait_ticks", 32, "ticks"),
    # PortXmitData/PortRcvData count 4-byte words.
    "port_xmit_data": _pma("tx_bytes", 32, "bytes", 4),
    "port_rcv_data": _pma("rx_bytes", 32, "bytes", 4),
    "port_xmit_packets": _pma("tx_packets", 32, "packets"),
    "port_rcv_packets": _pma("rx_packets", 32, "packets"),
    "unicast_xmit_packets": _pma("tx_unicast_packets", 64, "packets"),
    "unicast_rcv_packets": _pma("rx_unicast_packets", 64, "packets"),
    "multicast_xmit_packets": _pma("tx_multicast_packets", 64, "packets"),
    "multicast_rcv_packets": _pma("rx_multicast_packets", 64, "packets"),
}

_RDMA_HW_NAMES = {
    "out_of_buffer": "rx_no_buffer_drops",
    "out_of_sequence": "rx_out_of_sequence",
    "local_ack_timeout_err": "ack_timeouts",
    "packet_seq_err": "packet_seq_errors",
    "implied_nak_seq_err": "implied_nak_seq_errors",
    "rnr_nak_retry_err": "rnr_nak_retry_errors",
    "duplicate_request": "duplicate_requests",
    "np_cnp_sent": "cnp_sent",
    "np_ecn_marked_roce_packets": "rx_ecn_marked",
    "rp_cnp_handled": "cnp_handled",
    "rp_cnp_ignored": "cnp_ignored",
    "roce_adp_retrans": "adaptive_retransmissions",
    "roce_adp_retrans_to": "adaptive_retransmission_timeouts",
    "req_cqe_error": "req_cqe_errors",
    "resp_cqe_error": "resp_cqe_errors",
    "req_remote_access_errors": "req_remote_access_errors",
    "resp_remote_access_errors": "resp_remote_access_errors",
    "rx_read_requests": "rx_read_requests",
    "rx_write_requests": "rx_write_requests",
    "rx_atomic_requests": "rx_atomic_requests",
}
_MLX5_HW_64BIT = {"np_cnp_sent", "np_ecn_marked_roce_packets", "rp_cnp_handled", "rp_cnp_ignored",
                  "rx_icrc_encapsulated"}

_NETDEV = {
    "rx_bytes": ("rx_bytes", "bytes"), "tx_bytes": ("tx_bytes", "bytes"),
    "rx_packets": ("rx_packets", "packets"), "tx_packets": ("tx_packets", "packets"),
    "rx_dropped": ("rx_drops", "packets"), "tx_dropped": ("tx_drops", "packets"),
    "rx_errors": ("rx_errors", "packets"), "tx_errors": ("tx_errors", "packets"),
    "rx_crc_errors": ("rx_crc_errors", "packets"), "rx_missed_errors": ("rx_missed", "packets"),
    "rx_fifo_errors": ("rx_fifo_errors", "packets"), "rx_over_errors": ("rx_overruns", "packets"),
}

# ethtool -S names per driver: (pattern, canonical template, unit). ``{0}`` is the priority.
_ETHTOOL: dict[str, list[tuple[str, str, str]]] = {
    "mlx5_core": [
        (r"rx_bytes_phy", "port_rx_bytes", "bytes"), (r"tx_bytes_phy", "port_tx_bytes", "bytes"),
        (r"rx_packets_phy", "port_rx_packets", "packets"), (r"tx_packets_phy", "port_tx_packets", "packets"),
        (r"rx_pause_ctrl_phy", "rx_pause_frames", "frames"), (r"tx_pause_ctrl_phy", "tx_pause_frames", "frames"),
        (r"rx_prio(\d)_pause", "rx_pfc_frames_prio{0}", "frames"),
        (r"tx_prio(\d)_pause", "tx_pfc_frames_prio{0}", "frames"),
        (r"rx_prio(\d)_pause_duration", "rx_pfc_pause_us_prio{0}", "us"),
        (r"tx_prio(\d)_pause_duration", "tx_pfc_pause_us_prio{0}", "us"),
        (r"rx_prio(\d)_discards", "rx_discards_prio{0}", "packets"),
        (r"rx_discards_phy", "rx_port_discards", "packets"), (r"tx_discards_phy", "tx_port_discards", "packets"),
        (r"rx_out_of_buffer", "rx_no_buffer_drops", "packets"),
        (r"rx_crc_errors_phy", "rx_crc_errors", "packets"), (r"rx_symbol_err_phy", "rx_symbol_errors", "count"),
        (r"link_down_events_phy", "link_down_events", "count"),
        (r"rx_corrected_bits_phy", "fec_corrected_bits", "bits"),
        (r"rx_ecn_mark", "rx_ecn_marked", "packets"),
        (r"tx_pause_storm_warning_events", "pause_storm_warnings", "count"),
        (r"tx_pause_storm_error_events", "pause_storm_errors", "count"),
    ],
    "bnxt_en": [
        (r"rx_pause_frames", "rx_pause_frames", "frames"), (r"tx_pause_frames", "tx_pause_frames", "frames"),
        (r"rx_pfc_ena_frames_pri(\d)", "rx_pfc_frames_prio{0}", "frames"),
        (r"tx_pfc_ena_frames_pri(\d)", "tx_pfc_frames_prio{0}", "frames"),
        (r"rx_fcs_err_frames", "rx_crc_errors", "packets"),
    ],
    "ice": [
        (r"link_xoff_rx(?:\.nic)?", "rx_pause_frames", "frames"), (r"link_xoff_tx(?:\.nic)?", "tx_pause_frames", "frames"),
        (r"rx_priority_(\d)_xoff(?:\.nic)?", "rx_pfc_frames_prio{0}", "frames"),
        (r"tx_priority_(\d)_xoff(?:\.nic)?", "tx_pfc_frames_prio{0}", "frames"),
        (r"rx_crc_errors(?:\.nic)?", "rx_crc_errors", "packets"),
        (r"rx_dropped\.nic", "rx_port_discards", "packets"),
    ],
}
_ETHTOOL_COMMON = [(r"([rt]x)_(bytes|packets)", "{0}_{1}", "")]  # software totals, every driver
_MLX5_ETHTOOL_32BIT = {"rx_out_of_buffer", "rx_if_down_packets"}
_COMPILED = {driver: [(re.compile(p), c, u) for p, c, u in rules] for driver, rules in _ETHTOOL.items()}
_COMPILED_COMMON = [(re.compile(p), c, u) for p, c, u in _ETHTOOL_COMMON]

# NVML field values read by dpro.collectors.counters.nvml: raw name -> (canonical, unit, scale).
GPU_FIELDS = {
    "total_energy_consumption": ("energy", "mJ", 1),
    "pcie_replay_counter": ("pcie_replays", "count", 1),
    "pcie_count_tx_bytes": ("pcie_tx_bytes", "bytes", 1),
    "pcie_count_rx_bytes": ("pcie_rx_bytes", "bytes", 1),
    "nvlink_throughput_data_tx": ("nvlink_tx_bytes", "bytes", 1024),  # KiB
    "nvlink_throughput_data_rx": ("nvlink_rx_bytes", "bytes", 1024),
    "nvlink_crc_data_error_count_total": ("nvlink_crc_errors", "count", 1),
    "nvlink_replay_error_count_total": ("nvlink_replays", "count", 1),
    "nvlink_recovery_error_count_total": ("nvlink_recoveries", "count", 1),
    "ecc_sbe_vol_total": ("ecc_corrected", "count", 1),
    "ecc_dbe_vol_total": ("ecc_uncorrected", "count", 1),
}


FAULT_COUNTERS = frozenset({
    "symbol_errors", "link_recoveries", "link_down_events", "rx_errors", "rx_remote_physical_errors",
    "rx_switch_relay_errors", "tx_discards", "tx_constraint_errors", "rx_constraint_errors", "link_integrity_errors",
    "buffer_overruns", "vl15_drops", "rx_no_buffer_drops", "rx_out_of_sequence", "ack_timeouts", "packet_seq_errors",
    "implied_nak_seq_errors", "rnr_nak_retry_errors", "req_cqe_errors", "resp_cqe_errors", "tx_errors", "rx_drops",
    "tx_drops", "rx_crc_errors", "rx_missed", "rx_fifo_errors", "rx_overruns", "rx_port_discards", "tx_port_discards",
    "rx_symbol_errors", "pause_storm_errors", "nvlink_crc_errors", "nvlink_replays", "nvlink_recoveries",
    "ecc_uncorrected", "pcie_replays",
})
"""Canonical names of counters that count faults: errors, drops, link losses, retries. Any
increase during a job is worth reporting."""


def describe(source: str, name: str, driver: str | None = None) -> CounterInfo:
    """Metadata of the raw counter ``name`` of ``source`` on a device bound to ``driver``.

    ``driver=None`` (unknown) matches the ``ethtool`` names of every known vendor.
    """
    if source == "rdma":
        return _RDMA.get(name, CounterInfo(None))
    if source == "rdma_hw":
        width = 32 if driver == "mlx5_core" and name not in _MLX5_HW_64BIT else 64
        return CounterInfo(_RDMA_HW_NAMES.get(name), width=width)
    if source == "netdev":
        canonical, unit = _NETDEV.get(name, (None, "count"))
        return CounterInfo(canonical, unit)
    if source == "ethtool":
        return _describe_ethtool(name, driver)
    if source == "gpu":
        canonical, unit, scale = GPU_FIELDS.get(name, (None, "count", 1))
        return CounterInfo(canonical, unit, scale)
    raise ValueError(f"unknown counter source {source!r}")


def _describe_ethtool(name: str, driver: str | None) -> CounterInfo:
    width = 32 if driver in (None, "mlx5_core") and name in _MLX5_ETHTOOL_32BIT else 64
    drivers = [driver] if driver in _COMPILED else list(_COMPILED) if driver is None else []
    for d in drivers:
        for pattern, canonical, unit in _COMPILED[d]:
            if m := pattern.fullmatch(name):
                return CounterInfo(canonical.format(*m.groups()), unit, width=width)
    for pattern, canonical, _ in _COMPILED_COMMON:
        if m := pattern.fullmatch(name):
            return CounterInfo(canonical.format(*m.groups()), m.group(2), width=width)
    return CounterInfo(None, width=width)
