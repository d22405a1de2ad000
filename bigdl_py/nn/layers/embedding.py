"""Embedding lookup tables: ``Embedding`` (BigDL's ``LookupTable``) and ``EmbeddingBag``."""

from __future__ import annotations

from typing import Any

import numpy as np

from bigdl_py.autograd import ops
from bigdl_py.autograd.ops.embedding_bag import MODES, embedding_bag
from bigdl_py.nn import init
from bigdl_py.nn.layers._arguments import check_flag, check_int, check_positive_int
from bigdl_py.nn.layers._base import empty_parameter, label, parameter_dtype
from bigdl_py.nn.module import Module

__all__ = ["Embedding", "EmbeddingBag"]


def _padding_index(padding_idx: Any, num_embeddings: int, layer_name: str) -> int | None:
    """``padding_idx`` checked against the vocabulary and made non-negative (PyTorch's rule)."""
    if padding_idx is None:
        return None
    padding_idx = check_int(padding_idx, "padding_idx", layer_name)  # 1.5 is not row 1
    if not -num_embeddings <= padding_idx < num_embeddings:
        raise ValueError(
            f"{layer_name}: padding_idx {padding_idx} is outside a vocabulary of {num_embeddings}"
        )
    return padding_idx % num_embeddings


def _reset_table(weight, padding_idx: int | None) -> None:
    """PyTorch's default: N(0, 1) rows, the padding row zero."""
    init.normal_(weight)
    if padding_idx is not None:
        weight.data[padding_idx] = 0


class Embedding(Module):
    """A table of ``num_embeddings`` vectors of size ``embedding_dim``, looked up by index.

    Parameters
    ----------
    num_embeddings : int
        Vocabulary size; indices must lie in ``[0, num_embeddings)``.
    embedding_dim : int
        Size of each vector.
    padding_idx : int, optional
        A row that starts as zeros and gets no gradient (negative counts from the end).
    dtype : dtype or str, optional
        Parameter dtype (default float32).

    Notes
    -----
    Input: integer indices of any shape (a Tensor or an array); output: ``(*shape,
    embedding_dim)``. ``weight`` starts as ``N(0, 1)``, PyTorch's default. BigDL's
    ``LookupTable`` takes 1-based indices; ours are 0-based.
    """

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        padding_idx: int | None = None,
        dtype: Any = None,
    ):
        super().__init__()
        self.num_embeddings = check_positive_int(num_embeddings, "num_embeddings", "Embedding")
        self.embedding_dim = check_positive_int(embedding_dim, "embedding_dim", "Embedding")
        self.padding_idx = _padding_index(padding_idx, self.num_embeddings, "Embedding")
        dtype = parameter_dtype(dtype, "Embedding")
        self.weight = empty_parameter((self.num_embeddings, self.embedding_dim), dtype)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        _reset_table(self.weight, self.padding_idx)

    def forward(self, indices):
        dtype = indices.dtype if hasattr(indices, "dtype") else np.asarray(indices).dtype
        if dtype.kind not in "iu":
            raise TypeError(f"{label(self)}: indices must be integers, got dtype {dtype}")
        return ops.embedding(indices, self.weight, self.padding_idx)

    def extra_repr(self) -> str:
        text = f"{self.num_embeddings}, {self.embedding_dim}"
        return text if self.padding_idx is None else text + f", padding_idx={self.padding_idx}"


class EmbeddingBag(Module):
    """The sum, mean or max of the embeddings of each bag of indices, without building the
    per-index embeddings (recommendation and bag-of-words models).

    Parameters
    ----------
    num_embeddings : int
        Vocabulary size; indices must lie in ``[0, num_embeddings)``.
    embedding_dim : int
        Size of each vector.
    mode : {"mean", "sum", "max"}
        How a bag's rows are reduced (default "mean", as PyTorch).
    include_last_offset : bool
        ``offsets`` has one more entry, the end of the last bag (CSR layout).
    padding_idx : int, optional
        Entries equal to it are left out of their bag (and of the mean's count); its row
        starts as zeros and gets no gradient. Negative counts from the end.
    dtype : dtype or str, optional
        Parameter dtype (default float32).

    Notes
    -----
    ``forward(input, offsets=None, per_sample_weights=None)``: ``input`` is ``(B, L)`` (each
    row a bag) or ``(M,)`` with ``offsets (B,)`` giving where each bag starts (from 0,
    non-decreasing); the output is ``(B, embedding_dim)``, an empty bag giving zeros.
    ``per_sample_weights`` (shaped like ``input``, mode ``sum`` only) scale each row.
    ``weight`` starts as ``N(0, 1)``, PyTorch's default. PyTorch's ``max_norm``,
    ``scale_grad_by_freq`` and ``sparse`` are not supported; the arguments after
    ``embedding_dim`` are keyword-only, since PyTorch's positional order starts with those.
    """

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        *,
        mode: str = "mean",
        include_last_offset: bool = False,
        padding_idx: int | None = None,
        dtype: Any = None,
    ):
        super().__init__()
        self.num_embeddings = check_positive_int(num_embeddings, "num_embeddings", "EmbeddingBag")
        self.embedding_dim = check_positive_int(embedding_dim, "embedding_dim", "EmbeddingBag")
        if mode not in MODES:
            raise ValueError(f"EmbeddingBag: mode must be one of {MODES}, got {mode!r}")
        self.mode = mode
        self.include_last_offset = check_flag(
            include_last_offset, "include_last_offset", "EmbeddingBag"
        )
        self.padding_idx = _padding_index(padding_idx, self.num_embeddings, "EmbeddingBag")
        dtype = parameter_dtype(dtype, "EmbeddingBag")
        self.weight = empty_parameter((self.num_embeddings, self.embedding_dim), dtype)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        _reset_table(self.weight, self.padding_idx)

    def forward(self, input, offsets=None, per_sample_weights=None):  # noqa: A002 - PyTorch's
        return embedding_bag(
            input,
            self.weight,
            offsets,
            mode=self.mode,
            per_sample_weights=per_sample_weights,
            include_last_offset=self.include_last_offset,
            padding_idx=self.padding_idx,
            name=label(self),
        )

    def extra_repr(self) -> str:
        text = f"{self.num_embeddings}, {self.embedding_dim}, mode={self.mode!r}"
        if self.include_last_offset:
            text += ", include_last_offset=True"
        return text if self.padding_idx is None else text + f", padding_idx={self.padding_idx}"
