"""Cumulative GPU counters through NVML (nvidia-ml-py): energy, PCIe and NVLink traffic, errors.

All are read in one ``nvmlDeviceGetFieldValues`` call per GPU; a field the GPU or driver does not
support is left out. Without NVML or a GPU the result is empty, with a note saying why.
"""

from __future__ import annotations

from typing import Any

from dpro.collectors.counters.catalog import GPU_FIELDS

# The NVML value union's member for each NVML_VALUE_TYPE_*.
_VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")


def read_gpu_counters() -> tuple[dict[str, dict[str, int]], list[str]]:
    """``{"gpu<i>": {field: value}}`` for every GPU, and notes on what could not be read."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as e:  # no binding, no driver library, no permission: all mean "no GPU counters"
        return {}, [f"GPU counters not read: NVML unavailable ({type(e).__name__}: {e})"]
    try:
        try:
            count = pynvml.nvmlDeviceGetCount()
        except Exception as e:
            return {}, [f"GPU counters not read: NVML could not count GPUs ({type(e).__name__}: {e})"]
        if count == 0:
            return {}, ["GPU counters not read: NVML found no GPU"]
        fields = [(name, getattr(pynvml, f"NVML_FI_DEV_{name.upper()}", None)) for name in GPU_FIELDS]
        known = [(name, fid) for name, fid in fields if fid is not None]
        out, notes = {}, []
        for i in range(count):
            try:
                values = pynvml.nvmlDeviceGetFieldValues(pynvml.nvmlDeviceGetHandleByIndex(i),
                                                         [fid for _, fid in known])
            except Exception as e:
                notes.append(f"gpu{i}: NVML field values unavailable ({type(e).__name__}: {e})")
                continue
            out[f"gpu{i}"] = {name: v for (name, _), raw in zip(known, values)
                              if (v := _field_value(raw)) is not None}
        return out, notes
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _field_value(raw: Any) -> int | None:
    """The integer value of one NVML field value, None when NVML did not return it."""
    if raw.nvmlReturn != 0 or not 0 <= raw.valueType < len(_VALUE_MEMBERS):
        return None
    return int(getattr(raw.value, _VALUE_MEMBERS[raw.valueType]))
