"""A background sampler of every local GPU through NVML (nvidia-ml-py).

One sampler runs per recording node, in the ``dpro record`` process, so the training processes
pay nothing for it. Samples go to a CSV file as they are taken, so a killed job keeps them.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from dpro.collectors.sampling import CsvSampler

COLUMNS = (
    "time_ns", "gpu", "util_gpu_pct", "util_mem_pct", "sm_clock_mhz", "power_w", "mem_used_mib",
    "throttle_reasons", "pcie_tx_kib_s", "pcie_rx_kib_s", "nvlink_tx_kib", "nvlink_rx_kib",
)


class GpuSampler(CsvSampler):
    """Samples utilisation, SM clock, power, memory, throttle reasons and PCIe/NVLink traffic.

    ``start()`` returns a one-line note: what is sampled, or why nothing is (no NVML, no GPU).
    """

    columns = COLUMNS

    def __init__(self, path: Path, interval_s: float = 0.1) -> None:
        super().__init__(path, interval_s)
        self._nvml: Any = None
        self._handles: list[Any] = []

    def start(self) -> str:
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i)
                             for i in range(pynvml.nvmlDeviceGetCount())]
        except Exception as e:  # NVML missing, no driver, no permission: all mean "no samples"
            return f"not sampled: NVML unavailable ({type(e).__name__}: {e})".strip()
        if not self._handles:
            return "not sampled: NVML found no GPU"
        self._launch("dpro-gpu-sampler")
        return f"sampled {len(self._handles)} GPU(s) every {self.interval_s * 1000:.0f} ms"

    def stop(self) -> None:
        super().stop()
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass

    def _sample(self) -> list[list[Any]]:
        now = time.time_ns()
        return [[now, i, *self._read(h)] for i, h in enumerate(self._handles)]

    def _read(self, h: Any) -> list[Any]:
        nv = self._nvml
        util = _optional(nv.nvmlDeviceGetUtilizationRates, h)
        mem = _optional(nv.nvmlDeviceGetMemoryInfo, h)
        power = _optional(nv.nvmlDeviceGetPowerUsage, h)
        nvlink = _optional(nv.nvmlDeviceGetFieldValues, h,
                           [nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX])
        return [
            util.gpu if util else "", util.memory if util else "",
            _optional(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM) or "",
            power / 1000 if power is not None else "",
            mem.used // 2**20 if mem else "",
            _optional(nv.nvmlDeviceGetCurrentClocksThrottleReasons, h) or 0,
            _optional(nv.nvmlDeviceGetPcieThroughput, h, nv.NVML_PCIE_UTIL_TX_BYTES) or "",
            _optional(nv.nvmlDeviceGetPcieThroughput, h, nv.NVML_PCIE_UTIL_RX_BYTES) or "",
            *(_field_value(v) for v in (nvlink or ["", ""])),
        ]


def _optional(fn: Any, *args: Any) -> Any:
    """Call an NVML query that a GPU may not support; ``None`` when it does not."""
    try:
        return fn(*args)
    except Exception:
        return None


def _field_value(v: Any) -> Any:
    if v == "" or getattr(v, "nvmlReturn", 1) != 0:
        return ""
    return v.value.ullVal
