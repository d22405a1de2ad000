"""Checking our ctypes declarations of NVIDIA's libraries against their C headers.

The headers come from NVIDIA's wheels (``nvidia/*/include`` in site-packages), a CUDA
toolkit (``/usr/local/cuda/include``, ``nvcc``'s) or ``BIGDL_PY_CUDA_INCLUDE`` (directories
separated by ``:``). Each declared function's prototype is found in the header text and
split into parameter types; a C compiler then checks, with static assertions, that every
parameter and result has the class (pointer, integer, floating), the size and, for 8-byte
integers, the signedness of the ctypes type we declared, and that every constant we name
after a header's constant has its value. Types are checked by the compiler, not parsed,
so typedefs, enums and ``const`` spellings need no table here.
"""

from __future__ import annotations

import ctypes
import glob
import os
import re
import shutil
import site
import subprocess
import sys

# __builtin_classify_type's classes (GCC, C mode: enums are integers)
INTEGER, POINTER, REAL = 1, 5, 8
# ctypes type -> (class, size, signed or None when not checked)
CTYPES_CLASSES = {
    ctypes.c_void_p: (POINTER, 8, None),
    ctypes.c_char_p: (POINTER, 8, None),
    ctypes.c_int: (INTEGER, 4, None),  # int, int32_t or an enum: the same in the ABI
    ctypes.c_uint32: (INTEGER, 4, None),
    ctypes.c_int64: (INTEGER, 8, True),
    ctypes.c_longlong: (INTEGER, 8, True),
    ctypes.c_size_t: (INTEGER, 8, False),
    ctypes.c_ulonglong: (INTEGER, 8, False),
    ctypes.c_float: (REAL, 4, None),
    ctypes.c_double: (REAL, 8, None),
}
_QUALIFIERS = re.compile(r"\b(CUDNN_DEPRECATED|CUDNNWINAPI|CUBLASWINAPI|CUBLASAPI|extern)\b")


def include_directories() -> list[str]:
    """Every directory that may hold the headers, in the order the compiler searches."""
    named = [d for d in os.environ.get("BIGDL_PY_CUDA_INCLUDE", "").split(":") if d]
    wheels = []
    for directory in [*site.getsitepackages(), *sys.path]:
        wheels += sorted(glob.glob(os.path.join(directory, "nvidia", "*", "include")))
    toolkit = ["/usr/local/cuda/include"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        toolkit.append(os.path.join(os.path.dirname(os.path.realpath(nvcc)), "..", "include"))
    found = [d for d in [*named, *wheels, *toolkit] if os.path.isdir(d)]
    return list(dict.fromkeys(os.path.realpath(d) for d in found))


def find_header(name: str, directories: list[str]) -> str | None:
    for directory in directories:
        path = os.path.join(directory, name)
        if os.path.exists(path):
            return path
    return None


def compiler() -> str | None:
    return shutil.which("gcc") or shutil.which("cc")


def _without_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def prototypes(texts: list[str], names) -> dict[str, tuple[str, list[str]]]:
    """``{name: (result type, [parameter types])}`` of the first declaration of each
    name in the headers' ``texts`` (parameter names dropped, ``[]`` as ``*``)."""
    found = {}
    for text in map(_without_comments, texts):
        for name in names:
            if name in found:
                continue
            match = re.search(r"([\w\s\*]+?)\b" + re.escape(name) + r"\s*\(([^;{]*?)\)\s*;", text)
            if match is None:
                continue
            result = " ".join(_QUALIFIERS.sub(" ", match.group(1)).split())
            result = result.split("}")[-1].strip()
            parameters = [p.strip() for p in match.group(2).split(",")]
            if parameters == ["void"] or parameters == [""]:
                parameters = []
            found[name] = (result, [_parameter_type(p) for p in parameters])
    return found


def _parameter_type(parameter: str) -> str:
    pointer = "[" in parameter
    parameter = re.sub(r"\[[^\]]*\]", "", parameter).strip()
    tokens = re.findall(r"\w+|\*", parameter)
    if len(tokens) > 1 and re.fullmatch(r"\w+", tokens[-1]):
        tokens = tokens[:-1]  # the parameter's name
    return " ".join(tokens) + (" *" if pointer else "")


def type_assertion(spelled: str, declared, label: str) -> str:
    """A C static assertion that type ``spelled`` matches ctypes type ``declared``."""
    kind, size, signed = CTYPES_CLASSES[declared]
    condition = f"__builtin_classify_type(({spelled})0) == {kind} && sizeof({spelled}) == {size}"
    if signed is not None:
        condition += f" && ((({spelled})-1) < 0) == {int(signed)}"
    return f'_Static_assert({condition}, "{label}: header {spelled}");'


def check(headers: list[str], directories: list[str], signatures: dict, constants: dict) -> str:
    """Compile the checks; returns "" when all hold, else what the compiler or the
    prototype search reported."""
    texts = [open(h, encoding="utf-8", errors="replace").read() for h in _all_headers(headers)]
    found = prototypes(texts, signatures)
    problems = [f"{name}: no prototype in the headers" for name in signatures if name not in found]
    lines = [f"#include <{os.path.basename(h)}>" for h in headers]
    for name, (result, arguments) in signatures.items():
        if name not in found:
            continue
        header_result, header_parameters = found[name]
        if len(header_parameters) != len(arguments):
            problems.append(
                f"{name}: header has {len(header_parameters)} parameters, we declare "
                f"{len(arguments)}"
            )
            continue
        lines.append(type_assertion(header_result, result, f"{name} result"))
        for index, (spelled, declared) in enumerate(zip(header_parameters, arguments, strict=True)):
            lines.append(type_assertion(spelled, declared, f"{name} argument {index}"))
    for name, value in constants.items():
        lines.append(f'_Static_assert(({name}) == ({value}), "{name} is not {value}");')
    source = "\n".join(lines) + "\n"
    command = [compiler(), "-std=c11", "-fsyntax-only", "-x", "c", "-"]
    command += [f"-I{d}" for d in directories]
    completed = subprocess.run(command, input=source, capture_output=True, text=True)
    if completed.returncode != 0:
        problems.append(completed.stderr[-4000:])
    return "\n".join(problems)


def _all_headers(headers: list[str]) -> list[str]:
    """The headers and their siblings (cudnn.h's declarations live in cudnn_*.h)."""
    paths = []
    for header in headers:
        paths += sorted(glob.glob(os.path.join(os.path.dirname(header), "*.h")))
    return list(dict.fromkeys(paths))


def named_constants(module, prefixes: tuple[str, ...]) -> dict[str, int]:
    """The module's integer constants named as the headers name them."""
    return {
        name: value
        for name, value in vars(module).items()
        if name.startswith(prefixes) and isinstance(value, int) and not isinstance(value, bool)
    }
