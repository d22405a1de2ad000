"""Embedding bags: the sum, mean or max of the embedding rows of each bag of indices.

One fused op instead of ``embedding`` followed by a reduction, because the per-index rows
``(M, D)`` need not be kept for the backward pass of ``sum`` and ``mean``: the gradient of
an index's row is its bag's output gradient (scaled), added into the weight gradient.
"""

from __future__ import annotations

import numpy as np

from bigdl_py import backend, device_waits
from bigdl_py.autograd.function import Function
from bigdl_py.autograd.ops.misc import check_indices, row_sums

MODES = ("sum", "mean", "max")


class EmbeddingBag(Function):
    """Reduce the rows ``weight[indices]`` over bags given by ``bag_of`` (one bag per index).

    Inputs: ``weight (V, D)`` and, optionally, ``per_sample_weights (M,)`` (mode ``sum``
    only). Options: ``indices (M,)`` and ``bag_of (M,)`` integer arrays with ``bag_of``
    non-decreasing (each bag a contiguous run), ``bag_count`` and ``mode``. Entries equal to
    ``padding_idx`` take no part. Output ``(bag_count, D)``; an empty bag gives zeros.
    """

    def forward(
        self,
        weight,
        per_sample_weights=None,
        indices=None,
        bag_of=None,
        bag_count=0,
        mode="mean",
        padding_idx=None,
    ):
        xp = backend.array_module(weight)
        device = backend.device_of(weight)
        indices = backend.to_device(indices, device)
        bag_of = backend.to_device(bag_of, device)
        self.keep = None  # which entries are not padding, when some may be
        self.on_device = backend.is_device_array(weight)
        if self.on_device:
            return self._device_forward(
                xp, weight, per_sample_weights, indices, bag_of, bag_count, mode, padding_idx
            )
        if padding_idx is not None:
            self.keep = indices != padding_idx
            indices, bag_of = indices[self.keep], bag_of[self.keep]
            if per_sample_weights is not None:
                per_sample_weights = per_sample_weights[self.keep]
        self.mode, self.weight_shape, self.bag_count = mode, weight.shape, bag_count
        rows = xp.take(weight, indices, axis=0)
        if mode == "max":
            return self._max_forward(xp, rows, indices, bag_of)
        if per_sample_weights is not None:
            rows *= per_sample_weights[:, None]
        output = _bag_sums(xp, rows, bag_of, bag_count)
        scale = None
        if mode == "mean":
            counts = xp.bincount(bag_of, minlength=bag_count)
            # An empty bag stays zero instead of 0 / 0.
            scale = (1.0 / xp.maximum(counts, 1)).astype(weight.dtype)
            output *= scale[:, None]
        self.save_for_backward(indices, bag_of, scale, per_sample_weights, weight)
        return output

    def _device_forward(
        self, xp, weight, per_sample_weights, indices, bag_of, bag_count, mode, padding_idx
    ):
        """The forward without reading the device: padding entries are masked out (not
        selected, which sizes a result on the host), counts and maxima are scatters."""
        self.mode, self.weight_shape, self.bag_count = mode, weight.shape, bag_count
        if padding_idx is not None:
            self.keep = indices != padding_idx
        rows = xp.take(weight, indices, axis=0)
        if mode == "max":
            return self._device_max_forward(xp, rows, indices, bag_of)
        if per_sample_weights is not None:
            rows *= per_sample_weights[:, None]
        if self.keep is not None:
            rows *= self.keep[:, None].astype(rows.dtype)
        output = xp.zeros((bag_count, rows.shape[1]), dtype=rows.dtype)
        backend.scatter_add(output, bag_of, rows)
        scale = None
        if mode == "mean":
            counts = xp.zeros(bag_count, dtype=weight.dtype)
            entries = xp.ones(indices.shape, weight.dtype) if self.keep is None else self.keep
            backend.scatter_add(counts, bag_of, entries.astype(weight.dtype))
            # An empty bag stays zero instead of 0 / 0.
            scale = (1.0 / xp.maximum(counts, 1)).astype(weight.dtype)
            output *= scale[:, None]
        self.save_for_backward(indices, bag_of, scale, per_sample_weights, weight)
        return output

    def _device_max_forward(self, xp, rows, indices, bag_of):
        """Per bag and feature the largest row value, the first of equal maxima winning,
        as scatters of the maximum and of the winning entry's position."""
        entries, size = rows.shape
        if self.keep is not None:
            rows = xp.where(self.keep[:, None], rows, -xp.inf).astype(rows.dtype)
        output = xp.full((self.bag_count, size), -xp.inf, dtype=rows.dtype)
        backend.scatter_reduce(output, bag_of, rows, "maximum")
        winner = rows == output[bag_of]
        winner |= xp.isnan(rows)  # a NaN is its bag's maximum, as on the host
        if self.keep is not None:
            winner &= self.keep[:, None]
        position = xp.where(winner, xp.arange(entries)[:, None], entries)
        first = xp.full((self.bag_count, size), entries, dtype=position.dtype)
        backend.scatter_reduce(first, bag_of, position, "minimum")
        empty = first == entries
        output = xp.where(empty, 0, output).astype(rows.dtype)
        if entries:
            winning_row = xp.where(empty, -1, indices[xp.minimum(first, entries - 1)])
        else:
            winning_row = xp.full(first.shape, -1, dtype=indices.dtype)
        self.save_for_backward(winning_row)
        return output

    def _max_forward(self, xp, rows, indices, bag_of):
        """Per bag and feature, the largest row value; the first of equal maxima wins.

        Segment reductions over the bags' runs of rows, so memory follows the indices
        ``(M, D)``, never bags x longest bag x D (one bag of 20,000 among 1,000 small ones
        made that 2.5 GB at D = 16).
        """
        entries = rows.shape[0]
        output = _bag_reduce(xp, rows, bag_of, self.bag_count, "maximum", -xp.inf)
        # Each entry equal to its bag's maximum may win; a NaN is its bag's maximum (maximum
        # propagates it, as torch.max does; PyTorch's EmbeddingBag keeps a NaN only when it
        # comes first), so it may too. The first such entry of the bag wins, as PyTorch's.
        may_win = rows == output[bag_of]
        may_win |= xp.isnan(rows)
        position = xp.arange(entries, dtype=xp.int64)[:, None]
        candidates = xp.where(may_win, position, entries)
        winner = _bag_reduce(xp, candidates, bag_of, self.bag_count, "minimum", entries)
        empty = winner == entries  # only an empty bag has no winner
        output[empty] = 0
        # The vocabulary row that won each (bag, feature); -1 marks an empty bag.
        if entries:
            winning_row = indices[xp.minimum(winner, entries - 1)]
        else:
            winning_row = xp.zeros(winner.shape, dtype=xp.int64)
        winning_row[empty] = -1
        self.save_for_backward(winning_row)
        return output

    def backward(self, grad):
        xp = backend.array_module(grad)
        size = self.weight_shape[1]
        if self.mode == "max":
            grad_weight = xp.zeros(self.weight_shape, dtype=grad.dtype)
            (winning_row,) = self.saved
            filled = winning_row >= 0
            features = xp.broadcast_to(xp.arange(size), winning_row.shape)
            if self.on_device:  # an empty bag adds a zero to element 0: no selection
                positions = xp.where(filled, winning_row * size + features, 0)
                backend.scatter_add(grad_weight.reshape(-1), positions, xp.where(filled, grad, 0))
                return grad_weight, None
            backend.scatter_add(
                grad_weight.reshape(-1),
                (winning_row * size + features)[filled],
                grad[filled],
            )
            return grad_weight, None
        indices, bag_of, scale, per_sample_weights, weight = self.saved
        entry_grad = grad[bag_of]  # (M, D): each index's bag gradient
        if scale is not None:
            entry_grad *= scale[bag_of, None]
        grad_samples = None
        if per_sample_weights is not None:
            if self.needs_input_grad[1]:
                kept = (entry_grad * xp.take(weight, indices, axis=0)).sum(axis=1)
                grad_samples = self._expand(xp, kept)
            entry_grad *= per_sample_weights[:, None]
        if self.on_device and self.keep is not None:
            entry_grad *= self.keep[:, None].astype(entry_grad.dtype)  # padding adds nothing
        return row_sums(indices, entry_grad, self.weight_shape[0]), grad_samples

    def _expand(self, xp, kept_values):
        """Per-index values of the kept entries, with zeros at the padding entries."""
        if self.keep is None:
            return kept_values
        if self.on_device:  # every entry was kept in place, padding ones masked
            return kept_values * self.keep.astype(kept_values.dtype)
        full = xp.zeros(self.keep.shape, dtype=kept_values.dtype)
        full[self.keep] = kept_values
        return full

    def _release_extra(self) -> None:
        self.keep = None


def _bag_sums(xp, rows, bag_of, bag_count: int):
    """``(bag_count, D)`` sums of the rows of each bag (bags are contiguous runs)."""
    return _bag_reduce(xp, rows, bag_of, bag_count, "add", 0)


def _bag_reduce(xp, rows, bag_of, bag_count: int, how: str, empty_value):
    """``(bag_count, D)``: ``how`` (``"add"``, ``"maximum"``, ``"minimum"``) of the rows of
    each bag (bags are contiguous runs); an empty bag's row is ``empty_value``."""
    output = xp.full((bag_count, rows.shape[1]), empty_value, dtype=rows.dtype)
    if xp is not np or not rows.shape[0]:
        backend.scatter_reduce(output, bag_of, rows, how)
        return output
    # On the host one reduceat over the runs beats ufunc.at (4x on 20k rows of 64 for add).
    starts = np.flatnonzero(np.r_[True, bag_of[1:] != bag_of[:-1]])
    output[bag_of[starts]] = getattr(np, how).reduceat(rows, starts, axis=0)
    return output


def embedding_bag(
    indices,
    weight,
    offsets=None,
    mode: str = "mean",
    per_sample_weights=None,
    include_last_offset: bool = False,
    padding_idx: int | None = None,
    name: str = "embedding_bag",
):
    """Sum, mean or max of the rows of ``weight (V, D)`` over each bag of ``indices``.

    Parameters
    ----------
    indices : Tensor or array of int
        ``(B, L)``: ``B`` bags of ``L`` indices each; or ``(M,)`` with ``offsets``.
    weight : Tensor
        The embedding table ``(V, D)``.
    offsets : Tensor or array of int, optional
        With 1-d ``indices`` only: where each bag starts, ``(B,)`` beginning with 0 and
        non-decreasing; with ``include_last_offset``, ``(B + 1,)`` whose last entry is the
        number of indices (CSR layout).
    mode : {"sum", "mean", "max"}
    per_sample_weights : Tensor, optional
        Shaped like ``indices``: each row is scaled by its weight before summing (mode
        ``sum`` only); it receives a gradient too.
    include_last_offset : bool
    padding_idx : int, optional
        Entries equal to it are left out of their bag (and out of the mean's count).
    name : str
        How errors name the caller (a layer passes its label).

    Returns
    -------
    Tensor
        ``(B, D)``; an empty bag gives zeros.

    Raises
    ------
    ValueError, TypeError, IndexError
        Naming the bad argument: mode, shapes, offsets, an index outside the vocabulary.
    """
    from bigdl_py.autograd.tensor import Tensor

    if mode not in MODES:
        raise ValueError(f"{name}: mode must be one of {MODES}, got {mode!r}")
    index_data = indices.data if isinstance(indices, Tensor) else indices
    offsets_data = offsets.data if isinstance(offsets, Tensor) else offsets
    if backend.is_device_array(index_data) or backend.is_device_array(offsets_data):
        # Ids (or offsets) already on a device are laid out and checked there.
        index_array, flat, bag_of, bag_count = _device_layout(
            index_data, offsets_data, weight, include_last_offset, name
        )
        return _apply(
            weight, per_sample_weights, index_array, flat, bag_of, bag_count, mode,
            padding_idx, name,
        )  # fmt: skip
    index_array = backend.as_numpy(index_data)
    index_array = _integer_array(index_array, "indices", name)
    vocabulary = weight.shape[0]
    if index_array.ndim == 2:
        if offsets is not None:
            raise ValueError(
                f"{name}: offsets must be None with 2-d indices {index_array.shape} (each row "
                "is a bag)"
            )
        bag_count, length = index_array.shape
        bag_of = np.repeat(np.arange(bag_count), length)
    elif index_array.ndim == 1:
        if offsets is None:
            raise ValueError(
                f"{name}: 1-d indices {index_array.shape} need offsets (where each bag starts)"
            )
        bag_of, bag_count = _bags_from_offsets(
            offsets, index_array.shape[0], include_last_offset, name
        )
    else:
        raise ValueError(
            f"{name}: indices must be (B, L), or (M,) with offsets, got shape {index_array.shape}"
        )
    flat = index_array.reshape(-1)
    if flat.size and (flat.min() < 0 or flat.max() >= vocabulary):
        raise IndexError(
            f"{name}: indices must be in [0, {vocabulary - 1}] for a vocabulary of "
            f"{vocabulary} rows, got min {int(flat.min())} and max {int(flat.max())}"
        )
    return _apply(
        weight, per_sample_weights, index_array, flat, bag_of, bag_count, mode, padding_idx, name
    )


def _apply(weight, per_sample_weights, index_array, flat, bag_of, bag_count, mode, padding_idx,
           name):  # fmt: skip
    """Check the per-sample weights against the indices and run the op."""
    inputs = [weight]
    if per_sample_weights is not None:
        if mode != "sum":
            raise ValueError(
                f"{name}: per_sample_weights work only with mode='sum', not mode={mode!r}"
            )
        dtype = per_sample_weights.dtype
        if not backend.is_floating(dtype):  # PyTorch too wants the weight's dtype
            raise TypeError(
                f"{name}: per_sample_weights must be floating point, got dtype {np.dtype(dtype)}"
            )
        shape = tuple(per_sample_weights.shape)
        if shape != index_array.shape:
            raise ValueError(
                f"{name}: per_sample_weights must have the shape of indices "
                f"{index_array.shape}, got {shape}"
            )
        inputs.append(per_sample_weights.reshape(-1))
    return EmbeddingBag.apply(
        *inputs,
        indices=flat,
        bag_of=bag_of,
        bag_count=bag_count,
        mode=mode,
        padding_idx=padding_idx,
    )


def _device_layout(index_data, offsets_data, weight, include_last_offset: bool, name: str):
    """``(indices, flat indices, bag_of, bag_count)`` on the weight's device, laid out
    without reading it: the range of the ids and the offsets' rules are checked there
    (inside a training step, read at the next sync point)."""
    device = backend.device_of(weight.data if hasattr(weight, "data") else weight)
    index_array = backend.to_device(index_data, device)
    if index_array.dtype.kind not in "iu":
        raise TypeError(f"{name}: indices must be integers, got dtype {index_array.dtype}")
    index_array = index_array.astype(np.int64, copy=False)
    xp = backend.array_module(index_array)
    if index_array.ndim == 2:
        if offsets_data is not None:
            raise ValueError(
                f"{name}: offsets must be None with 2-d indices {index_array.shape} (each row "
                "is a bag)"
            )
        bag_count, length = index_array.shape
        bag_of = xp.arange(bag_count * length, dtype=np.int64) // max(length, 1)
    elif index_array.ndim == 1:
        if offsets_data is None:
            raise ValueError(
                f"{name}: 1-d indices {index_array.shape} need offsets (where each bag starts)"
            )
        bag_of, bag_count = _device_bags(
            offsets_data, index_array.shape[0], include_last_offset, device, name
        )
    else:
        raise ValueError(
            f"{name}: indices must be (B, L), or (M,) with offsets, got shape {index_array.shape}"
        )
    flat = index_array.reshape(-1)
    if flat.size:
        check_indices(flat, weight.shape[0], name)
    return index_array, flat, bag_of, bag_count


def _device_bags(offsets_data, total: int, include_last_offset: bool, device, name: str):
    """``_bags_from_offsets`` on a device: each index's bag by a sorted search of the
    starts, the offsets' rules checked there."""
    offsets_array = backend.to_device(offsets_data, device)
    if offsets_array.dtype.kind not in "iu":
        raise TypeError(f"{name}: offsets must be integers, got dtype {offsets_array.dtype}")
    least = 2 if include_last_offset else 1
    if offsets_array.ndim != 1 or offsets_array.shape[0] < least:
        what = "2 entries (include_last_offset)" if include_last_offset else "1 entry"
        raise ValueError(
            f"{name}: offsets must be 1-d with at least {what}, got {offsets_array.shape}"
        )
    xp = backend.array_module(offsets_array)
    offsets_array = offsets_array.astype(np.int64, copy=False)
    starts = offsets_array[:-1] if include_last_offset else offsets_array
    ends = (
        offsets_array[1:]
        if include_last_offset
        else xp.concatenate([offsets_array[1:], xp.asarray([total], dtype=np.int64)])
    )
    bad = (starts[0] != 0) | xp.any(ends < starts) | (ends[-1] > total)
    if include_last_offset:
        bad = bad | (ends[-1] != total)
    device_waits.check(
        bad,
        lambda offsets: ValueError(
            f"{name}: offsets must start at 0, never decrease and stay within the {total} "
            f"indices (with include_last_offset end at {total}), got "
            f"{backend.as_numpy(offsets).tolist()}"
        ),
        offsets_array,
    )
    positions = xp.arange(total, dtype=np.int64)
    bag_of = xp.searchsorted(starts, positions, side="right") - 1
    return bag_of, int(starts.shape[0])


def _integer_array(array, what: str, name: str):
    if array.dtype.kind not in "iu":
        raise TypeError(f"{name}: {what} must be integers, got dtype {array.dtype}")
    return array.astype(np.int64, copy=False)


def _bags_from_offsets(offsets, total: int, include_last_offset: bool, name: str):
    """``(bag_of, bag_count)``: the bag of each index, from the bags' starts."""
    from bigdl_py.autograd.tensor import Tensor

    starts = backend.as_numpy(offsets.data if isinstance(offsets, Tensor) else offsets)
    starts = _integer_array(starts, "offsets", name)
    if starts.ndim != 1 or starts.shape[0] < (2 if include_last_offset else 1):
        least = "2 entries (include_last_offset)" if include_last_offset else "1 entry"
        raise ValueError(f"{name}: offsets must be 1-d with at least {least}, got {starts.shape}")
    ends = starts[1:] if include_last_offset else np.append(starts[1:], total)
    starts = starts[:-1] if include_last_offset else starts
    if starts[0] != 0 or np.any(ends < starts) or ends[-1] > total:
        raise ValueError(
            f"{name}: offsets must start at 0, never decrease and stay within the {total} "
            f"indices, got {starts.tolist() + ([int(ends[-1])] if include_last_offset else [])}"
        )
    if include_last_offset and ends[-1] != total:
        # PyTorch's contract (CSR layout); PyTorch itself, given a shorter last offset,
        # sums the last bag to that offset but divides its mean by the count to the end.
        raise ValueError(
            f"{name}: with include_last_offset the last offset must equal the number of "
            f"indices, {total}, got {int(ends[-1])}"
        )
    return np.repeat(np.arange(starts.shape[0]), ends - starts), int(starts.shape[0])
