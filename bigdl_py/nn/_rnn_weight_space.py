"""Where PyTorch's recurrent parameters lie in cuDNN's RNN weight space, and the copies
between them (the cuDNN LSTM/GRU route's, ``_rnn_cudnn``).

cuDNN keeps one layer's weights in one buffer of its own layout; ``cudnnGetRNNWeightParams``
says where each linear layer's matrix and bias lie. cuDNN's gate order is PyTorch's: LSTM
linear layers 0-3 are the input's ``i, f, g, o`` and 4-7 the hidden state's; GRU 0-2 the
input's ``r, z, n`` and 3-5 the hidden state's (:data:`LINEAR_LAYERS`). So each of
PyTorch's gate blocks (rows ``g*H`` to ``(g+1)*H`` of a ``(gates*H, in)`` weight, row-major
like cuDNN's ``(H, in)`` matrix) is one copy, and copies that continue on both sides merge:
with cuDNN's usual layout a parameter's direction is one copy. Pure Python and array-module
agnostic, so the CPU tests check it on layouts cuDNN may report.
"""

from __future__ import annotations

from dataclasses import dataclass

from bigdl_py.autograd.ops.cudnn import CudnnError

GATES = {"lstm": 4, "gru": 3}
# cuDNN's linear-layer ids of each PyTorch parameter's gate blocks, in PyTorch's row order.
LINEAR_LAYERS = {
    "lstm": {"input": (0, 1, 2, 3), "hidden": (4, 5, 6, 7)},  # i, f, g, o
    "gru": {"input": (0, 1, 2), "hidden": (3, 4, 5)},  # r, z, n
}
# PyTorch's parameters in the order copy runs number them.
PARAMETERS = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")


@dataclass(frozen=True)
class CopyRun:
    """``length`` elements of PyTorch parameter ``PARAMETERS[source]`` (flat, all
    directions), from ``source_offset``, lie at ``space_offset`` of cuDNN's weight space."""

    source: int
    source_offset: int
    space_offset: int
    length: int


def pytorch_blocks(cell: str, directions: int, features: int, size: int, with_bias: bool):
    """Every gate block of PyTorch's parameters: ``(pseudo_layer, linear_layer_id,
    is_bias, source, source_offset, length)``, ``pseudo_layer`` being the direction.

    ``weight_ih (D, gates*H, F)`` holds direction ``d``'s gate ``g`` as rows ``g*H`` to
    ``(g+1)*H`` of ``d``'s matrix: cuDNN's ``(H, F)`` matrix of that linear layer, row-major.
    """
    gates = GATES[cell]
    ids = LINEAR_LAYERS[cell]
    for direction in range(directions):
        for gate in range(gates):
            block = direction * gates + gate
            yield (
                direction,
                ids["input"][gate],
                False,
                0,
                block * size * features,
                size * features,
            )
            yield (direction, ids["hidden"][gate], False, 1, block * size * size, size * size)
            if with_bias:
                yield (direction, ids["input"][gate], True, 2, block * size, size)
                yield (direction, ids["hidden"][gate], True, 3, block * size, size)


def copy_runs(cell, directions, features, size, with_bias, locate) -> list[CopyRun]:
    """The copies between PyTorch's parameters and cuDNN's weight space, merged where
    both sides continue. ``locate(pseudo_layer, linear_layer_id, is_bias)`` gives
    ``(offset, length)`` in elements of that matrix or bias in the weight space.

    Raises
    ------
    CudnnError
        When cuDNN's block is not the size PyTorch's is (the route then declines).
    """
    runs: list[CopyRun] = []
    for pseudo_layer, layer_id, is_bias, source, source_offset, length in pytorch_blocks(
        cell, directions, features, size, with_bias
    ):
        space_offset, space_length = locate(pseudo_layer, layer_id, is_bias)
        if space_length != length:
            what = "bias" if is_bias else "matrix"
            raise CudnnError(
                f"cuDNN's {what} {layer_id} of direction {pseudo_layer} holds {space_length} "
                f"elements, PyTorch's {PARAMETERS[source]} block {length}",
                0,
            )
        runs.append(CopyRun(source, source_offset, space_offset, length))
    runs.sort(key=lambda run: (run.source, run.source_offset))
    merged: list[CopyRun] = []
    for run in runs:
        last = merged[-1] if merged else None
        if (
            last is not None
            and last.source == run.source
            and last.source_offset + last.length == run.source_offset
            and last.space_offset + last.length == run.space_offset
        ):
            merged[-1] = CopyRun(
                last.source, last.source_offset, last.space_offset, last.length + run.length
            )
        else:
            merged.append(run)
    return merged


def pack(space, parameters, runs) -> None:
    """Copy PyTorch's ``parameters`` (C-contiguous, in :data:`PARAMETERS` order) into the
    flat weight ``space``."""
    flats = [parameter.reshape(-1) for parameter in parameters]
    for run in runs:
        source = flats[run.source][run.source_offset : run.source_offset + run.length]
        space[run.space_offset : run.space_offset + run.length] = source


def unpack(space, targets, runs) -> None:
    """Copy the flat weight ``space`` (a gradient) into PyTorch-shaped ``targets``."""
    flats = [target.reshape(-1) for target in targets]
    for run in runs:
        target = flats[run.source][run.source_offset : run.source_offset + run.length]
        target[...] = space[run.space_offset : run.space_offset + run.length]
