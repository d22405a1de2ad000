"""PyTorch weights in and out: ``state_dict`` files in the safetensors format, never pickle.

A safetensors file is an 8-byte header length, a JSON header (each tensor's dtype, shape and
byte range) and the raw little-endian data, so reading one runs no code. Tensor names are
``Module.state_dict()`` names, which are PyTorch's for layers built with the same names
(``0.weight``, ``layer1.0.bn1.running_mean``, ``weight_ih_l0``, ...): a model whose
``state_dict`` PyTorch wrote with ``safetensors.torch.save_file`` loads into the bigdl_py
model with the same layers, and a file written here loads into PyTorch with
``safetensors.torch.load_file``. Only the ``safetensors`` package's NumPy API is used; torch
is not needed.

Dtype rules, on load: a floating-point tensor (F16, BF16, F32, F64) loads into a
floating-point parameter or buffer and is cast to *that tensor's* dtype (the model decides,
as ``torch.nn.Module.load_state_dict`` does; F64 into F32 rounds); an integer tensor loads
into an integer buffer (BatchNorm's ``num_batches_tracked``) of any integer dtype that holds
its values. Anything else (a float into an integer buffer, an integer or bool into a
parameter) is a mismatch. On save, every tensor keeps its dtype.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Mapping

import numpy as np

from bigdl_py.nn._safetensors_header import FLOAT_DTYPES, INTEGER_DTYPES, read_header
from bigdl_py.nn.module import Module
from bigdl_py.nn.serialization import atomic_write

__all__ = ["load_safetensors", "save_safetensors"]


def save_safetensors(
    model: Module, path: str | os.PathLike, metadata: Mapping[str, str] | None = None
) -> None:
    """Write ``model.state_dict()`` to ``path`` as a safetensors file (atomically).

    Parameters
    ----------
    model : Module
        Any module; parameters and buffers are stored under their ``state_dict`` names,
        each in its own dtype.
    path : str or PathLike
        The file to write (``.safetensors`` is conventional); it holds either its old
        content or the complete new one, never a partial file.
    metadata : mapping of str to str, optional
        Stored in the header's ``__metadata__``; ``{"format": "pt"}`` by default, which
        tells Hugging Face's loaders that the names are PyTorch ``state_dict`` names.

    Raises
    ------
    ValueError
        If a tensor's dtype has no safetensors equivalent.
    TypeError
        If ``metadata`` is not a mapping of strings to strings.
    """
    from safetensors.numpy import save  # noqa: PLC0415 - an optional import kept local

    metadata = {"format": "pt"} if metadata is None else dict(metadata)
    if not all(isinstance(key, str) and isinstance(value, str) for key, value in metadata.items()):
        raise TypeError(f"save_safetensors: metadata must map str to str, got {metadata!r}")
    tensors = OrderedDict()
    for name, array in model.state_dict().items():
        array = np.asarray(array, order="C")  # ascontiguousarray would make 0-d arrays 1-d
        if array.dtype.kind not in "fiub":
            raise ValueError(
                f"save_safetensors: {name} has dtype {array.dtype}, which safetensors cannot store"
            )
        tensors[name] = array
    payload = save(tensors, metadata=metadata)
    atomic_write(path, lambda file: file.write(payload))


def load_safetensors(
    model: Module, path: str | os.PathLike, strict: bool = True
) -> tuple[list[str], list[str]]:
    """Copy the tensors of a safetensors file into ``model``'s parameters and buffers.

    Parameters
    ----------
    model : Module
        A model built with the layers (and so the ``state_dict`` names and shapes) of the
        model that wrote the file. Tensors are copied in place, so flat-parameter views
        stay views.
    path : str or PathLike
        A safetensors file, e.g. from ``safetensors.torch.save_file(torch_model.state_dict(),
        path)`` or :func:`save_safetensors`.
    strict : bool
        When True (default) every model tensor must be in the file and every file tensor in
        the model. When False, names missing on either side are skipped and returned.

    Returns
    -------
    (missing, unexpected) : (list of str, list of str)
        Model names not in the file, and file names not in the model.

    Raises
    ------
    ValueError
        If the file is a ``torch.save`` pickle (with how to convert it), is not a
        safetensors file or is truncated; or, in one message listing them all, for missing
        and unexpected names (strict mode), shape mismatches and dtype mismatches (see the
        module docstring for the dtype rules).
    FileNotFoundError
        If ``path`` does not exist.
    """
    path = os.fspath(path)
    entries, data_start = read_header(path)
    targets = _named_tensors(model)
    missing = [name for name in targets if name not in entries]
    unexpected = [name for name in entries if name not in targets]
    mismatches = []
    for name, target in targets.items():
        if name not in entries:
            continue
        entry = entries[name]
        shape = tuple(entry["shape"])
        if shape != target.shape:
            mismatches.append(f"{name}: file {shape} vs model {target.shape}")
        problem = _dtype_problem(entry["dtype"], target.dtype)
        if problem:
            mismatches.append(f"{name}: {problem}")
    if mismatches or (strict and (missing or unexpected)):
        problems = []
        if missing:
            problems.append(f"missing from the file: {missing}")
        if unexpected:
            problems.append(f"not in the model: {unexpected}")
        if mismatches:
            problems.append(f"mismatched: {mismatches}")
        raise ValueError(
            f"load_safetensors: {path} does not fit {type(model).__name__}; " + "; ".join(problems)
        )
    wanted = {name: entries[name] for name in targets if name in entries}
    model.load_state_dict(_read_arrays(path, wanted, data_start), strict=False)
    return missing, unexpected


def _named_tensors(model: Module) -> OrderedDict:
    """``state_dict`` name -> the live parameter or buffer (no copies)."""
    named = OrderedDict()
    for module_name, module in model.named_modules():
        for registry in (module._parameters, module._buffers):
            for name, value in registry.items():
                if value is not None:
                    named[f"{module_name}.{name}" if module_name else name] = value
    return named


def _dtype_problem(file_dtype: str, target_dtype: np.dtype) -> str | None:
    """Why a tensor stored as ``file_dtype`` cannot load into ``target_dtype``, or None."""
    target_dtype = np.dtype(target_dtype)
    if file_dtype in FLOAT_DTYPES:
        if target_dtype.kind == "f":
            return None
    elif file_dtype in INTEGER_DTYPES:
        if target_dtype.kind in "iu" and np.can_cast(INTEGER_DTYPES[file_dtype], target_dtype):
            return None
        if target_dtype.kind in "iu":
            return f"file dtype {file_dtype} does not fit model dtype {target_dtype}"
    elif file_dtype != "BOOL":
        return f"file dtype {file_dtype} is not supported"
    return f"file dtype {file_dtype} cannot load into model dtype {target_dtype}"


def _read_arrays(path: str, entries: Mapping[str, dict], data_start: int) -> dict:
    """Read the named tensors as NumPy arrays; BF16 widened exactly to float32."""
    from safetensors import SafetensorError, safe_open  # noqa: PLC0415 - optional, kept local

    arrays = {}
    name = None
    # read_header has checked what the format asks; should the library still refuse the
    # file (a rule it adds later), say so as the documented ValueError, naming the file.
    try:
        with safe_open(path, framework="numpy") as opened:
            for name, entry in entries.items():
                if entry["dtype"] != "BF16":
                    arrays[name] = opened.get_tensor(name)
    except SafetensorError as error:
        tensor = "" if name is None else f" (reading tensor {name!r})"
        raise ValueError(
            f"load_safetensors: {path}: the safetensors library refused the file{tensor}: {error}"
        ) from None
    bf16 = {name: entry for name, entry in entries.items() if entry["dtype"] == "BF16"}
    if bf16:
        with open(path, "rb") as file:
            for name, entry in bf16.items():
                begin, end = entry["data_offsets"]
                file.seek(data_start + begin)
                raw = np.frombuffer(file.read(end - begin), dtype="<u2")
                # bfloat16 is the top half of a float32: shifting it up is exact.
                widened = (raw.astype(np.uint32) << 16).view(np.float32)
                arrays[name] = widened.reshape(entry["shape"])
    return arrays
