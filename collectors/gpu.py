"""A background sampler of every local GPU through NVML (nvidia-ml-py).

One sampler runs per recording node, in the ``dpro record`` process, so the training processes
pay nothing for it. Samples go to a CSV file as they are taken, so a killed job keeps them.
"""

from __future__ import annotations

import csv
import threading
import time
from pathlib import Path
from typing import Any

COLUMNS = (
    "time_ns", "gpu", "util_gpu_pct", "util_mem_pct", "sm_clock_mhz", "power_w", "mem_used_mib",
    "throttle_reasons", "pcie_tx_kib_s", "pcie_rx_kib_s", "nvlink_tx_kib", "nvlink_rx_kib",
)


class GpuSampler:
    """Samples utilisation, SM clock, power, memory, throttle reasons and PCIe/NVLink traffic.

    ``start()`` returns a one-line note: what is sampled, or why nothing is (no NVML, no GPU).
    """

    def __init__(self, path: Path, interval_s: float = 0.1) -> None:
        self.path = path
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml: Any = None
        self._handles: list[Any] = []
        self.error: str | None = None

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
        self._thread = threading.Thread(target=self._run, name="dpro-gpu-sampler", daemon=True)
        self._thread.start()
        return f"sampled {len(self._handles)} GPU(s) every {self.interval_s * 1000:.0f} ms"

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass

    def _run(self) -> None:
        with open(self.path, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(COLUMNS)
            while not self._stop.is_set():
                now = time.time_ns()
                try:
                    for i, h in enumerate(self._handles):
                        writer.writerow([now, i, *self._sample(h)])
                    f.flush()
                except Exception as e:
                    self.error = f"{type(e).__name__}: {e}"
                    return
                self._stop.wait(self.interval_s)

    def _sample(self, h: Any) -> list[Any]:
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
