"""Loading cuDNN (``cudnn.loaded``) and the small rules the routes share, without a GPU."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

from bigdl_py.autograd.ops import cuda_libraries, cudnn


@pytest.fixture
def fresh_load(monkeypatch):
    """``cudnn.loaded`` tried anew in the test, and forgotten after it."""
    cudnn.loaded.cache_clear()
    monkeypatch.delenv(cudnn.LIBRARY_VARIABLE, raising=False)
    yield monkeypatch
    cudnn.loaded.cache_clear()


def _installed_wheel() -> str:
    for directory in cuda_libraries.site_directories():
        path = os.path.join(directory, cudnn.WHEEL_PATHS[0])
        if os.path.exists(path):
            return path
    pytest.skip("nvidia-cudnn-cu12/-cu13 is not installed")


def test_no_library_anywhere_is_quiet(fresh_load):
    fresh_load.setattr(cuda_libraries, "site_directories", lambda: [])
    fresh_load.setattr(cudnn, "SONAME", "libcudnn-not-here.so.9")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cudnn.loaded() is None
    assert not cudnn.available()


def test_a_named_library_that_fails_is_reported(fresh_load, tmp_path):
    missing = str(tmp_path / "libcudnn.so.9")
    fresh_load.setenv(cudnn.LIBRARY_VARIABLE, missing)
    with pytest.warns(RuntimeWarning, match=f"cuDNN 9 does not load \\({missing}: "):
        assert cudnn.loaded() is None


def test_the_wheel_loads_for_its_own_cuda(fresh_load):
    path = _installed_wheel()
    built_for = cudnn._Library(path).cuda_major
    fresh_load.setattr(cuda_libraries, "cuda_runtime_major", lambda: built_for)
    library = cudnn.loaded()
    assert library is not None and library.path == path


def test_a_wheel_for_another_cuda_is_refused_and_named(fresh_load):
    path = _installed_wheel()
    built_for = cudnn._Library(path).cuda_major
    fresh_load.setattr(cuda_libraries, "cuda_runtime_major", lambda: built_for - 1)
    expected = f"built for CUDA {built_for}, CuPy runs CUDA {built_for - 1}"
    with pytest.warns(RuntimeWarning, match=expected):
        assert cudnn.loaded() is None


def test_without_cupy_nothing_loads(fresh_load):
    _installed_wheel()  # a library that loads, on a machine whose CuPy cannot run

    def no_cupy():
        raise RuntimeError("a CUDA device was requested but CuPy is not available")

    fresh_load.setattr(cuda_libraries, "cuda_runtime_major", no_cupy)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cudnn.loaded() is None


def test_the_switch_turns_the_routes_off(monkeypatch):
    monkeypatch.setattr(cudnn, "loaded", lambda: object())
    for text, on in (("1", True), ("0", False), ("off", False), ("False", False)):
        monkeypatch.setenv(cudnn.SWITCH_VARIABLE, text)
        assert cudnn.available() is on


@pytest.mark.parametrize(
    ("dtype", "tf32", "math_type"),
    [
        ("float16", False, cudnn.CUDNN_TENSOR_OP_MATH),
        ("float32", False, cudnn.CUDNN_FMA_MATH),
        ("float32", True, cudnn.CUDNN_DEFAULT_MATH),
        ("float64", False, cudnn.CUDNN_DEFAULT_MATH),
    ],
)
def test_rnn_math_type_is_pytorchs(dtype, tf32, math_type):
    assert cudnn.rnn_math_type(dtype, tf32) == math_type


def test_contiguous_strides():
    assert cudnn.contiguous_strides((2, 3, 4)) == (12, 4, 1)
    assert cudnn.contiguous_strides((5, 0, 2)) == (2, 2, 1)
    assert cudnn.DATA_TYPES[np.dtype(np.float32)] == cudnn.CUDNN_DATA_FLOAT
