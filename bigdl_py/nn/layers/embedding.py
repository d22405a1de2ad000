"""Embedding lookup table (BigDL's ``LookupTable``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from bigdl_py.autograd import ops
from bigdl_py.nn import init
from bigdl_py.nn.layers._base import check_positive_int, empty_parameter, label, parameter_dtype
from bigdl_py.nn.module import Module

__all__ = ["Embedding"]


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
        if padding_idx is not None:
            if not -self.num_embeddings <= padding_idx < self.num_embeddings:
                raise ValueError(
                    f"Embedding: padding_idx {padding_idx} is outside a vocabulary of "
                    f"{self.num_embeddings}"
                )
            padding_idx = int(padding_idx) % self.num_embeddings
        self.padding_idx = padding_idx
        dtype = parameter_dtype(dtype, "Embedding")
        self.weight = empty_parameter((self.num_embeddings, self.embedding_dim), dtype)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init.normal_(self.weight)
        if self.padding_idx is not None:
            self.weight.data[self.padding_idx] = 0

    def forward(self, indices):
        dtype = indices.dtype if hasattr(indices, "dtype") else np.asarray(indices).dtype
        if dtype.kind not in "iu":
            raise TypeError(f"{label(self)}: indices must be integers, got dtype {dtype}")
        return ops.embedding(indices, self.weight, self.padding_idx)

    def extra_repr(self) -> str:
        text = f"{self.num_embeddings}, {self.embedding_dim}"
        return text if self.padding_idx is None else text + f", padding_idx={self.padding_idx}"
