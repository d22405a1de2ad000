"""Fused kernels for arrays on a GPU: one launch where composed array ops take many.

A GPU step made of CuPy's array operations issues a kernel (and often an allocation) for
every operation: batch norm's forward was ~25 of them. Each family here does its work in
one or two kernels, and comes in three parts:

* its CUDA source, ``cuda/<family>.cu`` (after ``cuda/prelude.cuh``), compiled by CuPy's
  NVRTC once per dtype (float32, float64) and device, the first time it runs; the tests
  compile every source with ``nvcc`` where it is installed;
* its NumPy reference, in ``<family>.py``: the kernel's arithmetic written with NumPy,
  operation for operation, which the CPU tests hold against the composed ops the package
  used before (and the GPU tests hold the compiled kernels against);
* the function the ops call, which runs one or the other.

The route is picked in one place, :func:`route`, as ``onednn.applies_to`` picks oneDNN's on
the host: ``"cuda"`` for CuPy arrays (the compiled kernels), ``"reference"`` for the strict
test device (``bigdl_py.strict_device``: the references run on its host memory, so the
tests without a GPU run the GPU's call sites), ``None`` for NumPy arrays, where callers
keep their CPU code: the kernels never change the CPU route. ``BIGDL_PY_FUSED_KERNELS=0``
turns them off (``None`` everywhere: the composed ops, on any device).
"""

from __future__ import annotations

import os

import numpy as np

from bigdl_py import backend

SWITCH_VARIABLE = "BIGDL_PY_FUSED_KERNELS"
_REAL_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
CUDA, REFERENCE = "cuda", "reference"


def enabled() -> bool:
    """Whether the fused kernels may run (the switch is not 0)."""
    return os.environ.get(SWITCH_VARIABLE, "1").strip().lower() not in ("0", "false", "no", "off")


def route(*arrays) -> str | None:
    """``"cuda"``, ``"reference"`` or ``None`` (see the module) for arrays that live together.

    Only float32 and float64 arrays take a fused route (the kernels are compiled for those);
    ``None`` entries are ignored.
    """
    first = None
    for array in arrays:
        if type(array) is np.ndarray:
            return None  # the host: the one check a CPU op pays
        if array is None:
            continue
        if not backend.is_device_array(array) or array.dtype not in _REAL_DTYPES:
            return None
        if first is None:
            first = array
    if first is None or not enabled():
        return None
    return CUDA if backend.is_cupy_array(first) else REFERENCE
