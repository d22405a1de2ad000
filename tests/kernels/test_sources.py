"""Every kernel source compiles with nvcc for float32 and float64 (skipped without nvcc):
the CUDA CuPy's NVRTC compiles on a GPU, with the same options."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from bigdl_py.kernels import compiler

NVCC = shutil.which("nvcc")


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.parametrize("real", ["float", "double"])
@pytest.mark.parametrize("family", compiler.families())
def test_the_source_compiles_to_ptx(tmp_path, family, real):
    source = tmp_path / f"{family}.cu"
    source.write_text(compiler.source(family))
    result = subprocess.run(
        [NVCC, "-ptx", f"-DREAL={real}", *compiler.COMPILE_OPTIONS, "-arch=compute_80",
         "-Werror", "all-warnings", str(source), "-o", str(tmp_path / f"{family}.ptx")],
        capture_output=True,
        text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    ptx = (tmp_path / f"{family}.ptx").read_text()
    for name in _kernel_names(family):
        assert f".entry {name}(" in ptx, f"{name} missing from {family}'s PTX"


def _kernel_names(family: str) -> list[str]:
    text = (compiler.SOURCE_DIRECTORY / f"{family}.cu").read_text()
    return [
        line.split("void", 1)[1].split("(", 1)[0].strip()
        for line in text.splitlines()
        if line.startswith('extern "C" __global__ void')
    ]


def _package_kernels() -> set:
    import importlib
    import pkgutil

    import bigdl_py.kernels as package

    found = set()
    for module_info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{module_info.name}")
        found |= {value for value in vars(module).values() if isinstance(value, compiler.Kernel)}
    return found


def test_every_kernel_the_package_launches_is_in_its_source_and_has_test_inputs():
    from cases import CASES

    launched = _package_kernels()
    assert len(launched) >= 20
    tested = {kernel_case.kernel for kernel_case in CASES}
    for kernel in launched:
        assert kernel.name in _kernel_names(kernel.family), kernel.name
        assert kernel in tested, f"{kernel.name} has no case in cases.py"
    for family in compiler.families():
        assert set(_kernel_names(family)) <= {k.name for k in launched}, family
