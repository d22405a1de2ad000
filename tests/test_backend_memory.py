"""backend.memory_bytes: the memory an output may never exceed (the device's total)."""

from __future__ import annotations

import os

import pytest

from bigdl_py import backend


def test_the_hosts_memory_is_its_physical_memory():
    expected = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert backend.memory_bytes(backend.CPU) == expected > 0


@pytest.mark.gpu
@pytest.mark.skipif(not backend.cuda_available(), reason="needs CuPy and a CUDA device")
def test_a_gpus_memory_is_its_total_memory():
    cupy = backend.cupy_module()
    with cupy.cuda.Device(0):
        free, total = cupy.cuda.runtime.memGetInfo()
    assert backend.memory_bytes(backend.device("cuda:0")) == total >= free > 0
