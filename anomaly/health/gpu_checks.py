"""GPU checks through NVML (nvidia-ml-py): ECC, XID events during the run, clock-event
(throttle) reasons, clocks, temperature, power, PCIe link and replays, NVLink state and errors.

:class:`GpuWatch` is started before the job-wide tests and finished after them, so counters are
read before and after, and XID events are those raised while the tests ran. A value NVML does
not support on a GPU is left out; without NVML or a GPU every check is skipped, saying why.
"""

from __future__ import annotations

from typing import Any

from dpro.anomaly.health.model import Check, Metric

__all__ = ["GpuWatch"]

# XIDs that mean the GPU needs attention now (NVIDIA's XID catalogue): double-bit ECC, fell off
# the bus, row remapping failure, NVLink error, contained/uncontained ECC, GSP errors.
CRITICAL_XIDS = {48, 63, 64, 74, 79, 92, 94, 95, 119, 120}
SLOWDOWN_REASONS = {0x8: "hardware slowdown", 0x20: "software thermal slowdown", 0x40: "hardware thermal slowdown",
                    0x80: "hardware power brake"}
NVLINK_ERRORS = ("replay", "recovery", "crc_flit", "crc_data")  # NVML_NVLINK_ERROR_DL_*, in order
TEMPERATURE_MARGIN_C = 5  # warn this close to the slowdown threshold


class GpuWatch:
    """Reads every local GPU at :meth:`start` and :meth:`finish`; ``busy``: the GPUs carried the
    tests' traffic (so a PCIe generation below its maximum is not idle power saving)."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._handles: list[Any] = []
        self._links: list[list[int]] = []  # per GPU, the NVLinks NVML reports
        self._before: list[dict[str, int]] = []
        self._events: Any = None
        self.note = ""

    def start(self) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
        except Exception as e:  # no binding, no driver, no permission: no GPU checks
            self.note = f"NVML unavailable ({type(e).__name__}: {e})"
            return
        self._nvml = pynvml
        self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        if not self._handles:
            self.note = "NVML found no GPU"
        self._links = [self._nvlinks(h) for h in self._handles]
        self._before = [self._counters(h, links) for h, links in zip(self._handles, self._links)]
        self._events = self._register_xid_events()

    def finish(self, busy: bool = False) -> list[Check]:
        """The checks of every GPU (one skipped check when there is none)."""
        if not self._handles:
            return [Check("gpu", "skip", self.note or "no GPU")]
        nv = self._nvml
        try:
            xids = self._drain_xid_events()
            checks = []
            for i, (handle, links, before) in enumerate(zip(self._handles, self._links, self._before)):
                after = self._counters(handle, links)
                checks += [self._ecc(i, handle, before, after), _xid_check(i, xids.get(i, [])),
                           self._throttle(i, handle), self._clocks(i, handle), self._temperature(i, handle),
                           self._power(i, handle), self._pcie(i, handle, before, after, busy),
                           self._nvlink(i, handle, links, before, after)]
            return checks
        finally:
            if self._events is not None:
                _try(nv.nvmlEventSetFree, self._events)
            _try(nv.nvmlShutdown)

    # -- reading -------------------------------------------------------------------------------

    def _counters(self, h: Any, links: list[int]) -> dict[str, int]:
        """Counters compared before and after: ECC aggregates, PCIe replays, NVLink errors."""
        nv = self._nvml
        out = {}
        for name, args in (("ecc_uncorrected_aggregate", (1, 1)), ("ecc_corrected_aggregate", (0, 1))):
            if (v := _try(nv.nvmlDeviceGetTotalEccErrors, h, *args)) is not None:
                out[name] = v
        if (v := _try(nv.nvmlDeviceGetPcieReplayCounter, h)) is not None:
            out["pcie_replays"] = v
        for link in links:
            for c, kind in enumerate(NVLINK_ERRORS):
                if (v := _try(nv.nvmlDeviceGetNvLinkErrorCounter, h, link, c)) is not None:
                    out[f"nvlink{link}_{kind}"] = v
        return out

    def _nvlinks(self, h: Any) -> list[int]:
        """The NVLinks NVML reports on this GPU (none when NVLink is not supported)."""
        links = []
        for link in range(self._nvml.NVML_NVLINK_MAX_LINKS):
            if _try(self._nvml.nvmlDeviceGetNvLinkState, h, link) is None:
                break
            links.append(link)
        return links

    def _register_xid_events(self) -> Any:
        nv = self._nvml
        events = _try(nv.nvmlEventSetCreate)
        if events is None:
            return None
        for h in self._handles:
            _try(nv.nvmlDeviceRegisterEvents, h, nv.nvmlEventTypeXidCriticalError, events)
        return events

    def _drain_xid_events(self) -> dict[int, list[int]]:
        """XIDs raised since :meth:`start`, per GPU index."""
        nv = self._nvml
        out: dict[int, list[int]] = {}
        if self._events is None:
            return out
        addresses = {_address(h): i for i, h in enumerate(self._handles)}
        while True:
            try:
                data = nv.nvmlEventSetWait(self._events, 0)
            except nv.NVMLError:  # NVML_ERROR_TIMEOUT: none left
                return out
            out.setdefault(addresses.get(_address(data.device), -1), []).append(int(data.eventData))

    # -- checks --------------------------------------------------------------------------------

    def _ecc(self, i: int, h: Any, before: dict[str, int], after: dict[str, int]) -> Check:
        nv = self._nvml
        check = Check(f"gpu{i}.ecc")
        values = {"ecc_uncorrected_volatile": _try(nv.nvmlDeviceGetTotalEccErrors, h, 1, 0),
                  "ecc_corrected_volatile": _try(nv.nvmlDeviceGetTotalEccErrors, h, 0, 0),
                  "ecc_uncorrected_aggregate": after.get("ecc_uncorrected_aggregate"),
                  "retired_pages_double_bit": _len(_try(nv.nvmlDeviceGetRetiredPages, h, 1)),
                  "retired_pages_single_bit": _len(_try(nv.nvmlDeviceGetRetiredPages, h, 0))}
        rows = _try(nv.nvmlDeviceGetRemappedRows, h)
        if rows is not None:
            values.update(remapped_rows_corrected=rows[0], remapped_rows_uncorrected=rows[1],
                          remap_pending=rows[2], remap_failed=rows[3])
        values = {k: v for k, v in values.items() if v is not None}
        if not values:
            return Check(check.name, "skip", "ECC is not supported or not enabled")
        check.metrics = [Metric(k, float(v), "count", False) for k, v in values.items()]
        if values.get("ecc_uncorrected_volatile", 0) > 0:
            check.escalate("fail", f"{values['ecc_uncorrected_volatile']} uncorrected ECC errors since the driver loaded")
        new = after.get("ecc_uncorrected_aggregate", 0) - before.get("ecc_uncorrected_aggregate", 0)
        if new > 0:
            check.escalate("fail", f"{new} uncorrected ECC errors during the check")
        if values.get("remap_failed"):
            check.escalate("fail", "row remapping failed: the GPU needs replacing")
        if values.get("remap_pending"):
            check.escalate("warn", "a row remap is pending: reset the GPU")
        if values.get("retired_pages_double_bit", 0) > 0:
            check.escalate("warn", f"{values['retired_pages_double_bit']} pages retired for double-bit errors")
        return check

    def _throttle(self, i: int, h: Any) -> Check:
        nv = self._nvml
        reasons = _try(getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", nv.nvmlDeviceGetCurrentClocksThrottleReasons), h)
        if reasons is None:
            return Check(f"gpu{i}.throttle", "skip", "clock event reasons are not supported")
        check = Check(f"gpu{i}.throttle", metrics=[Metric("reasons", float(reasons), "bitmask")],
                      evidence={"reasons": hex(reasons)})
        found = [name for bit, name in SLOWDOWN_REASONS.items() if reasons & bit]
        if found:
            check.escalate("warn", "clocks held down: " + ", ".join(found))
        return check

    def _clocks(self, i: int, h: Any) -> Check:
        nv = self._nvml
        sm, sm_max = _try(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM), _try(nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_SM)
        mem_max = _try(nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_MEM)
        metrics = [Metric(n, float(v), "MHz", b) for n, v, b in (("sm_mhz", sm, None), ("sm_max_mhz", sm_max, True),
                                                                 ("mem_max_mhz", mem_max, True)) if v is not None]
        return Check(f"gpu{i}.clocks", "pass" if metrics else "skip", "" if metrics else "clocks not readable",
                     metrics)

    def _temperature(self, i: int, h: Any) -> Check:
        nv = self._nvml
        temp = _try(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)
        if temp is None:
            return Check(f"gpu{i}.temperature", "skip", "temperature not readable")
        slowdown = _try(nv.nvmlDeviceGetTemperatureThreshold, h, nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
        check = Check(f"gpu{i}.temperature", metrics=[Metric("celsius", float(temp), "C", False)],
                      evidence={"slowdown_c": slowdown})
        if slowdown and temp >= slowdown - TEMPERATURE_MARGIN_C:
            check.escalate("warn", f"{temp} C, within {TEMPERATURE_MARGIN_C} C of the slowdown threshold {slowdown} C")
        return check

    def _power(self, i: int, h: Any) -> Check:
        nv = self._nvml
        usage, limit = _try(nv.nvmlDeviceGetPowerUsage, h), _try(nv.nvmlDeviceGetEnforcedPowerLimit, h)
        default = _try(nv.nvmlDeviceGetPowerManagementDefaultLimit, h)
        if usage is None and limit is None:
            return Check(f"gpu{i}.power", "skip", "power not readable")
        check = Check(f"gpu{i}.power", metrics=[Metric(n, v / 1000, "W", None) for n, v in
                                                 (("usage_w", usage), ("limit_w", limit), ("default_limit_w", default))
                                                 if v is not None])
        if limit is not None and default and limit < default:
            check.escalate("warn", f"power capped at {limit / 1000:.0f} W, below the default {default / 1000:.0f} W")
        return check

    def _pcie(self, i: int, h: Any, before: dict[str, int], after: dict[str, int], busy: bool) -> Check:
        nv = self._nvml
        gen, gen_max = _try(nv.nvmlDeviceGetCurrPcieLinkGeneration, h), _try(nv.nvmlDeviceGetMaxPcieLinkGeneration, h)
        width, width_max = _try(nv.nvmlDeviceGetCurrPcieLinkWidth, h), _try(nv.nvmlDeviceGetMaxPcieLinkWidth, h)
        if width is None and gen is None:
            return Check(f"gpu{i}.pcie", "skip", "PCIe link not readable")
        check = Check(f"gpu{i}.pcie", metrics=[Metric(n, float(v), "", None) for n, v in
                                                (("generation", gen), ("max_generation", gen_max), ("width", width),
                                                 ("max_width", width_max)) if v is not None])
        if width is not None and width_max and width < width_max:
            check.escalate("warn", f"PCIe link x{width}, below the device's x{width_max}")
        if busy and gen is not None and gen_max and gen < gen_max:  # idle GPUs drop their generation to save power
            check.escalate("warn", f"PCIe generation {gen} under load, below the device's {gen_max}")
        if "pcie_replays" in after:
            replays = after["pcie_replays"] - before.get("pcie_replays", after["pcie_replays"])
            check.metrics.append(Metric("replays_during_check", float(replays), "count", False))
            if replays > 0:
                check.escalate("warn", f"{replays} PCIe replays during the check")
        return check

    def _nvlink(self, i: int, h: Any, links: list[int], before: dict[str, int], after: dict[str, int]) -> Check:
        nv = self._nvml
        if not links:
            return Check(f"gpu{i}.nvlink", "skip", "no NVLink")
        states = {link: _try(nv.nvmlDeviceGetNvLinkState, h, link) for link in links}
        check = Check(f"gpu{i}.nvlink", metrics=[Metric("active_links", float(sum(bool(s) for s in states.values())),
                                                        "", True)])
        down = [link for link, s in states.items() if not s]
        if down and len(down) < len(links):
            check.escalate("warn", f"NVLink {', '.join(map(str, down))} down while {len(links) - len(down)} are up")
        grown = {k: after[k] - before.get(k, after[k]) for k in after if k.startswith("nvlink")}
        grown = {k: v for k, v in grown.items() if v > 0}
        if grown:
            check.evidence["errors_during_check"] = grown
            check.escalate("warn", "NVLink errors during the check: " + ", ".join(f"{k} +{v}" for k, v in grown.items()))
        return check


def _xid_check(i: int, xids: list[int]) -> Check:
    check = Check(f"gpu{i}.xid", metrics=[Metric("events", float(len(xids)), "count", False)],
                  evidence={"xids": xids})
    critical = sorted(set(xids) & CRITICAL_XIDS)
    if critical:
        check.escalate("fail", f"XID {', '.join(map(str, critical))} during the check")
    elif xids:
        check.escalate("warn", f"XID {', '.join(map(str, sorted(set(xids))))} during the check")
    return check


def _try(fn: Any, *args: Any) -> Any:
    """``fn(*args)``, or None when NVML says the GPU does not support it (or any NVML error)."""
    try:
        return fn(*args)
    except Exception:  # pynvml.NVMLError_NotSupported, _InvalidArgument, _NoPermission...
        return None


def _len(pages: Any) -> int | None:
    return None if pages is None else len(pages)


def _address(handle: Any) -> int:
    import ctypes

    return ctypes.cast(handle, ctypes.c_void_p).value or 0
