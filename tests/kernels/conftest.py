"""Fixtures of the kernel tests: the host emulation of the CUDA sources (needs g++)."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # cases.py, emulator.py

import emulator  # noqa: E402


@pytest.fixture(scope="session")
def emulate():
    """``emulate(kernel, blocks, dtype, *arguments)``: the CUDA source run on the host."""
    if emulator.COMPILER is None:
        pytest.skip("no C++ compiler (g++) to build the host emulation of the kernels")
    return emulator.emulate
