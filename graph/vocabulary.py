"""One vocabulary for traces: collective names and families, op categories, dtype sizes.

Every other module asks here, so that a name is normalised one way everywhere.

**Collectives.** Traces name a collective in many spellings: ``nccl:all_reduce`` and
``gloo:all_reduce`` annotations, ``c10d::allreduce_`` calls, NCCL kernels
(``ncclKernel_AllReduce_RING_LL_Sum_float``) and the ``Collective name`` argument
(``allreduce``, ``_allgather_base``). :func:`canonical_collective` gives the name
``torch.distributed`` uses (``all_reduce``, ``_all_gather_base``); :func:`collective_family`
the algorithm family (``all_gather`` for ``_all_gather_base`` and ``all_gather_coalesced``).

    >>> canonical_collective("AllReduce"), collective_in_name("c10d::allreduce_")
    ('all_reduce', 'all_reduce')
    >>> collective_family("_all_gather_base"), dtype_bytes("Long"), dtype_bytes("unsigned char")
    ('all_gather', 8, 1)

**Categories.** Kineto's event categories, with the 2021 schema's names renamed
(:func:`modern_category`); which run on a GPU (:data:`GPU_CATEGORIES`), which are the GPU's
ops in a dataflow graph (:data:`GPU_OP_CATEGORIES`) and which the CPU's (:data:`CPU_CATEGORIES`).

**Dtypes.** :func:`dtype_bytes` reads torch's ``ScalarType`` names (``Float``, ``Long``,
``Byte``, ``BFloat16``, as ``record_param_comms`` writes them), C++ type names (``float``,
``long int``, ``unsigned char``, ``c10::Half``) and NumPy-style names (``float32``, ``uint8``);
an unknown name has no size (None), never a guess.
"""

from __future__ import annotations

import re

__all__ = ["CPU_CATEGORIES", "GPU_CATEGORIES", "GPU_OP_CATEGORIES", "GRADIENT_FAMILIES", "P2P_FAMILIES",
           "ROOTED_FAMILIES", "STEP_NAME", "SYMMETRIC_FAMILIES", "SYNC_NAMES", "WINDOW_CATEGORY",
           "canonical_collective", "collective_family", "collective_in_name", "dtype_bytes", "is_enqueue_call",
           "modern_category", "step_number"]

# --- collectives -------------------------------------------------------------------------------

# letters-only spelling -> the name that torch.distributed uses in its nccl:/gloo: annotations
_COLLECTIVES = {
    "allreduce": "all_reduce", "allreducecoalesced": "all_reduce_coalesced",
    "allgather": "all_gather", "allgatherbase": "_all_gather_base",
    "allgathercoalesced": "all_gather_coalesced",
    "allgatherintotensorcoalesced": "all_gather_into_tensor_coalesced",
    "reducescatter": "reduce_scatter", "reducescatterbase": "_reduce_scatter_base",
    "reducescattertensorcoalesced": "reduce_scatter_tensor_coalesced",
    "alltoall": "all_to_all", "alltoallbase": "all_to_all", "alltoallv": "all_to_all",
    "sendrecv": "send_recv", "recvanysource": "recv_any_source", "monitoredbarrier": "barrier",
}
_COLLECTIVE_IN_NAME = re.compile(
    r"(?:nccl|gloo|ucc|mpi|xccl):(?P<annotation>\w+)"  # nccl:all_reduce, gloo:all_reduce
    r"|c10d::(?P<op>\w+)"  # c10d::allreduce_
    r"|nccl(?:Dev)?Kernel_(?P<kernel>[A-Za-z]+)")  # ncclKernel_AllReduce_RING_LL_Sum_float, ncclDevKernel_SendRecv
_FAMILY_PREFIXES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")

SYMMETRIC_FAMILIES = frozenset({"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "barrier"})
"""Collectives no rank can leave before every rank has joined."""
ROOTED_FAMILIES = frozenset({"broadcast", "reduce", "gather", "scatter"})
P2P_FAMILIES = frozenset({"send", "recv", "send_recv", "recv_any_source"})
GRADIENT_FAMILIES = frozenset({"all_reduce", "reduce_scatter"})
"""Collectives data parallelism reduces gradients with: the optimizer waits for them."""


def canonical_collective(name: str) -> str:
    """``allreduce``, ``AllReduce``, ``all_reduce`` → ``all_reduce``; unknown names lowercased."""
    return _COLLECTIVES.get(re.sub(r"[^a-z]", "", name.lower()), name.lower())


def collective_in_name(name: str) -> str | None:
    """The collective an event's name says it runs (an annotation, a ``c10d::`` call, an NCCL
    kernel), canonical; None for any other name (and for NCCL's generic kernel)."""
    m = _COLLECTIVE_IN_NAME.match(name)
    if m is None or m["kernel"] == "Generic":  # ncclDevKernel_Generic runs any collective
        return None
    return canonical_collective(m["annotation"] or m["kernel"] or m["op"].rstrip("_"))


def collective_family(name: str) -> str:
    """The family of a canonical collective name: ``_all_gather_base``, ``all_gather_coalesced``
    and ``all_gather_into_tensor_coalesced`` are ``all_gather``; others are themselves."""
    bare = name.lstrip("_")
    return next((prefix for prefix in _FAMILY_PREFIXES if bare.startswith(prefix)), bare)


def is_enqueue_call(name: str) -> bool:
    """Whether an event only issues a collective (a ``c10d::`` call, ``record_param_comms``),
    as opposed to doing its work."""
    return name.startswith("c10d::") or name == "record_param_comms"


# --- categories and op names -------------------------------------------------------------------

_OLD_CATEGORIES = {"Operator": "cpu_op", "Runtime": "cuda_runtime", "Kernel": "kernel",
                   "Memcpy": "gpu_memcpy", "Memset": "gpu_memset"}
GPU_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "cuda_sync"})
"""Categories of events that run on a GPU (they have a device and a stream)."""
GPU_OP_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
"""The GPU's own ops: what a dataflow graph keeps of a stream."""
CPU_CATEGORIES = ("cpu_op", "user_annotation", "python_function", "cuda_runtime", "cuda_driver")
"""The CPU's ops and calls: what a dataflow graph keeps of a thread."""
WINDOW_CATEGORY = "trace"
"""The category of the ``PyTorch Profiler (0)`` event that spans the profiling window."""
SYNC_NAMES = frozenset({"cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaMemcpy",
                        "hipDeviceSynchronize", "hipStreamSynchronize", "hipEventSynchronize", "hipMemcpy"})
"""Runtime calls that block the CPU until GPU work has finished."""
STEP_NAME = re.compile(r"ProfilerStep#(\d+)")


def modern_category(cat: str) -> str:
    """A category as current Kineto names it (``Kernel`` → ``kernel``)."""
    return _OLD_CATEGORIES.get(cat) or cat.lower()


def step_number(name: str) -> int:
    """``N`` of a ``ProfilerStep#N`` event's name, -1 for any other name."""
    m = STEP_NAME.fullmatch(name)
    return int(m[1]) if m else -1


# --- dtypes ----------------------------------------------------------------------------------

_DTYPE_BYTES = {
    # torch ScalarType names (c10::toString), as record_param_comms writes them
    "float": 4, "double": 8, "half": 2, "bfloat16": 2, "long": 8, "int": 4, "short": 2, "byte": 1, "char": 1,
    "bool": 1, "complexhalf": 4, "complexfloat": 8, "complexdouble": 16, "qint8": 1, "quint8": 1, "qint32": 4,
    "quint4x2": 1, "quint2x4": 1, "uint16": 2, "uint32": 4, "uint64": 8, "int8": 1, "int16": 2,
    "float8_e5m2": 1, "float8_e4m3fn": 1, "float8_e5m2fnuz": 1, "float8_e4m3fnuz": 1,
    # C++ spellings (aten's input types) and NumPy-style names
    "long int": 8, "long long": 8, "unsigned char": 1, "signed char": 1, "short int": 2, "unsigned short": 2,
    "c10::half": 2, "c10::bfloat16": 2, "float16": 2, "float32": 4, "float64": 8, "int32": 4, "int64": 8,
    "uint8": 1, "c10::complex<float>": 8, "c10::complex<double>": 16,
}


def dtype_bytes(name: str | None) -> int | None:
    """Bytes per element of a dtype named in a trace; None when the name is not known."""
    if not isinstance(name, str):
        return None
    key = name.strip().lower().removeprefix("torch.")
    return _DTYPE_BYTES.get(key)
