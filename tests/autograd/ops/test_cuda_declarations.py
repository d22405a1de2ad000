"""Our ctypes declarations of cuDNN and cuBLAS against NVIDIA's headers and libraries.

Runs without a GPU. Skipped where the headers (the ``nvidia-cudnn-cu12/-cu13`` and
``nvidia-cublas`` wheels, a CUDA toolkit) or a C compiler are absent; the library checks
where the wheels' shared libraries are absent (they load and answer their versions without
a GPU or a driver).
"""

from __future__ import annotations

import os

import cuda_headers
import pytest

from bigdl_py.autograd.ops import cublas, cuda_libraries, cudnn

DIRECTORIES = cuda_headers.include_directories()


def _headers_or_skip(*names: str) -> list[str]:
    if cuda_headers.compiler() is None:
        pytest.skip("no C compiler")
    found = [cuda_headers.find_header(name, DIRECTORIES) for name in names]
    if None in found or cuda_headers.find_header("cuda_runtime_api.h", DIRECTORIES) is None:
        pytest.skip(f"headers {names} and cuda_runtime_api.h not all found in {DIRECTORIES}")
    return found


def test_cudnn_declarations_match_the_headers():
    headers = _headers_or_skip("cudnn.h")
    constants = cuda_headers.named_constants(cudnn, ("CUDNN_",))
    assert len(constants) > 80  # the check below covers every constant the module names
    problems = cuda_headers.check(headers, DIRECTORIES, cudnn.SIGNATURES, constants)
    assert problems == ""


def test_cublas_declarations_match_the_headers():
    headers = _headers_or_skip("cublas_v2.h")
    constants = cuda_headers.named_constants(cublas, ("CUBLAS_", "CUDA_R_"))
    assert set(constants) >= {"CUBLAS_COMPUTE_32F_FAST_TF32", "CUDA_R_16F", "CUBLAS_OP_T"}
    problems = cuda_headers.check(headers, DIRECTORIES, cublas.SIGNATURES, constants)
    assert problems == ""


def test_the_check_catches_a_wrong_declaration():
    """The checker itself: a width, an argument count, a pointer and a constant, each
    wrong on purpose, are reported."""
    import ctypes

    headers = _headers_or_skip("cudnn.h")
    wrong = {
        "cudnnSetStream": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_int64]),  # a pointer
        "cudnnCreate": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p]),  # one too many
        "cudnnBackendSetAttribute": (
            ctypes.c_int,
            [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p],
        ),  # int64_t elementCount declared as int
    }
    problems = cuda_headers.check(headers, DIRECTORIES, wrong, {"CUDNN_ATTR_TENSOR_UNIQUE_ID": 905})
    assert "cudnnCreate: header has 1 parameters, we declare 2" in problems
    assert "cudnnSetStream argument 1" in problems
    assert "cudnnBackendSetAttribute argument 3" in problems
    assert "CUDNN_ATTR_TENSOR_UNIQUE_ID is not 905" in problems


def _wheel_library(relative: str) -> str:
    for directory in cuda_libraries.site_directories():
        path = os.path.join(directory, relative)
        if os.path.exists(path):
            return path
    pytest.skip(f"{relative} is not installed")


def test_the_cudnn_wheel_loads_with_every_declared_call():
    path = _wheel_library(cudnn.WHEEL_PATHS[0])
    library = cudnn._Library(path)  # resolves every name in SIGNATURES
    assert library.version >= cudnn.MINIMUM_VERSION
    assert library.cuda_major in (12, 13)


@pytest.mark.parametrize("major", [12, 13])
def test_the_cublas_wheel_loads_with_every_declared_call(major):
    relative = {12: "nvidia/cublas/lib/libcublas.so.12", 13: "nvidia/cu13/lib/libcublas.so.13"}
    path = _wheel_library(relative[major])
    library = cublas._Library(path)
    assert all(hasattr(library.cublas, name) for name in cublas.SIGNATURES)
