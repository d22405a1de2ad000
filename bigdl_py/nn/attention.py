"""Multi-head attention (PyTorch's ``nn.MultiheadAttention``; BigDL's ``Attention``).

Parameter names, shapes and the default initialisation are PyTorch's, so a PyTorch
``state_dict`` loads by name: ``in_proj_weight (3E, E)`` and ``in_proj_bias (3E,)`` (or
``q_proj_weight``, ``k_proj_weight``, ``v_proj_weight`` when keys or values have other
widths), and ``out_proj.weight``/``out_proj.bias``.

Projections are ``Linear`` ops; the attention itself is one fused op
(``ops.scaled_dot_product_attention``) unless the weights are asked for, when it
is composed from matmul, softmax and dropout so the weights have a gradient. Masks are
turned into one additive float mask (``-inf`` where attending is not allowed) before the
softmax, as PyTorch does.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from bigdl_py import backend
from bigdl_py.autograd import ops
from bigdl_py.autograd.tensor import Tensor
from bigdl_py.nn import init
from bigdl_py.nn.layers._arguments import check_flag, check_positive_int, check_probability
from bigdl_py.nn.layers._base import empty_parameter, parameter_dtype
from bigdl_py.nn.layers.linear import Linear
from bigdl_py.nn.module import Module

__all__ = ["MultiheadAttention"]


class MultiheadAttention(Module):
    """Scaled dot-product attention over ``num_heads`` heads of width ``embed_dim // num_heads``.

    For each head ``h``: ``softmax(q_h @ k_h.T / sqrt(head_dim) + mask) @ v_h``, where
    ``q``, ``k``, ``v`` are the linear projections of query, key and value; the heads'
    outputs are joined and projected by ``out_proj``.

    Parameters
    ----------
    embed_dim : int
        Width ``E`` of the query and of the output.
    num_heads : int
        Number of heads; must divide ``embed_dim``.
    dropout : float
        Dropout on the attention weights, in training only (default 0).
    bias : bool
        Learn biases of the input and output projections (default True).
    kdim, vdim : int, optional
        Widths of key and value (default ``embed_dim``).
    batch_first : bool
        Inputs and output are ``(N, L, E)`` when True; ``(L, N, E)`` when False (the
        default, as in PyTorch).
    dtype : dtype or str, optional
        Parameter dtype (default float32).

    Notes
    -----
    Initialisation as PyTorch: the input projection weights from Xavier-uniform, its bias
    and ``out_proj.bias`` zero, ``out_proj.weight`` as a ``Linear``'s. PyTorch's
    ``add_bias_kv`` and ``add_zero_attn`` are not supported.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        kdim: int | None = None,
        vdim: int | None = None,
        batch_first: bool = False,
        dtype: Any = None,
    ):
        super().__init__()
        name = "MultiheadAttention"
        self.embed_dim = check_positive_int(embed_dim, "embed_dim", name)
        self.num_heads = check_positive_int(num_heads, "num_heads", name)
        if self.embed_dim % self.num_heads:
            raise ValueError(
                f"{name}: embed_dim {self.embed_dim} is not divisible by num_heads {self.num_heads}"
            )
        self.head_dim = self.embed_dim // self.num_heads
        self.kdim = self.embed_dim if kdim is None else check_positive_int(kdim, "kdim", name)
        self.vdim = self.embed_dim if vdim is None else check_positive_int(vdim, "vdim", name)
        self.dropout = check_probability(dropout, "dropout", name)
        self.batch_first = check_flag(batch_first, "batch_first", name)
        bias = check_flag(bias, "bias", name)
        dtype = parameter_dtype(dtype, name)
        width = self.embed_dim
        # PyTorch's registration order, hence its state_dict order and our flat layout.
        self.same_embed_dim = self.kdim == width and self.vdim == width
        if self.same_embed_dim:
            self.in_proj_weight = empty_parameter((3 * width, width), dtype)
        else:
            self.register_parameter("in_proj_weight", None)
            self.q_proj_weight = empty_parameter((width, width), dtype)
            self.k_proj_weight = empty_parameter((width, self.kdim), dtype)
            self.v_proj_weight = empty_parameter((width, self.vdim), dtype)
        if bias:
            self.in_proj_bias = empty_parameter((3 * width,), dtype)
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = Linear(width, width, bias=bias, dtype=dtype)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """PyTorch's default: Xavier-uniform projections, zero biases."""
        if self.same_embed_dim:
            init.xavier_uniform_(self.in_proj_weight)
        else:
            for weight in (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight):
                init.xavier_uniform_(weight)
        if self.in_proj_bias is not None:
            init.zeros_(self.in_proj_bias)
            init.zeros_(self.out_proj.bias)

    # --- forward ------------------------------------------------------------------------
    def forward(
        self,
        query,
        key,
        value,
        key_padding_mask=None,
        need_weights: bool = True,
        attn_mask=None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ):
        """Attend from ``query`` to ``key``/``value``.

        Parameters
        ----------
        query : Tensor
            ``(L, N, E)``, or ``(N, L, E)`` with ``batch_first``, or unbatched ``(L, E)``.
        key, value : Tensor
            ``(S, N, kdim)`` and ``(S, N, vdim)`` (batch first, or unbatched, likewise).
        key_padding_mask : array or Tensor, optional
            ``(N, S)`` (``(S,)`` unbatched): bool, True marks a key to ignore; or float,
            added to the scores.
        need_weights : bool
            Also return the attention weights (default True).
        attn_mask : array or Tensor, optional
            ``(L, S)`` or ``(N * num_heads, L, S)``: bool, True marks a pair not allowed to
            attend; or float, added to the scores.
        average_attn_weights : bool
            Average the returned weights over the heads (default True).
        is_causal : bool
            With no ``attn_mask``, let position ``i`` attend only to keys ``j <= i``
            (PyTorch requires the mask itself; here it is built). With an ``attn_mask``,
            the mask is used as given.

        Returns
        -------
        output : Tensor
            Shaped like ``query`` with width ``E``.
        weights : Tensor or None
            ``(N, L, S)`` averaged over heads or ``(N, num_heads, L, S)`` (no ``N`` axis
            unbatched); None when ``need_weights`` is False. These are the weights after
            dropout, as PyTorch returns them.
        """
        self_attention = query is key and key is value
        query, key, value = (_as_tensor(x) for x in (query, key, value))
        batched = self._check_inputs(query, key, value)
        query, key, value = (self._batch_major(x, batched) for x in (query, key, value))
        if self_attention:
            key = value = query  # keeps _project's one-GEMM path
        batch, target_length, source_length = query.shape[0], query.shape[1], key.shape[1]
        mask = self._additive_mask(
            attn_mask,
            key_padding_mask,
            is_causal,
            batched,
            query,
            (batch, target_length, source_length),
        )
        queries, keys, values = self._project(query, key, value)
        heads = self.num_heads
        queries, keys, values = (
            ops.permute(ops.reshape(x, (batch, x.shape[1], heads, self.head_dim)), (0, 2, 1, 3))
            for x in (queries, keys, values)
        )
        dropout = self.dropout if self.training else 0.0
        if need_weights:
            # The weights are an output with a gradient of their own, so compose the ops.
            scale = 1.0 / math.sqrt(self.head_dim)
            scores = ops.matmul(queries * scale, ops.permute(keys, (0, 1, 3, 2)))
            if mask is not None:
                scores = scores + Tensor(mask, _copy=False)
            weights = ops.dropout(ops.softmax(scores, axis=-1), dropout)
            attended = ops.matmul(weights, values)  # (N, H, L, head_dim)
        else:
            attended = ops.scaled_dot_product_attention(queries, keys, values, mask, dropout)
        joined = ops.reshape(ops.permute(attended, (0, 2, 1, 3)), (batch, target_length, -1))
        output = self.out_proj(joined)
        if not batched:
            output = ops.reshape(output, output.shape[1:])
        elif not self.batch_first:
            output = ops.permute(output, (1, 0, 2))
        if not need_weights:
            return output, None
        if average_attn_weights:
            weights = ops.mean(weights, axis=1)
        if not batched:
            weights = ops.reshape(weights, weights.shape[1:])
        return output, weights

    def _batch_major(self, x: Tensor, batched: bool) -> Tensor:
        """``x`` as ``(N, length, features)``: a batch of one when unbatched."""
        if not batched:
            return ops.reshape(x, (1, *x.shape))
        return x if self.batch_first else ops.permute(x, (1, 0, 2))

    def _project(self, query: Tensor, key: Tensor, value: Tensor) -> tuple:
        """The query, key and value projections, each ``(N, length, E)``."""
        width = self.embed_dim
        thirds = [slice(k * width, (k + 1) * width) for k in range(3)]
        if self.same_embed_dim and query is key and key is value:
            # Self-attention: one GEMM for all three projections.
            packed = ops.linear(query, self.in_proj_weight, self.in_proj_bias)
            return tuple(ops.getitem(packed, (Ellipsis, third)) for third in thirds)
        if self.same_embed_dim:
            weights = tuple(ops.getitem(self.in_proj_weight, third) for third in thirds)
        else:
            weights = (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight)
        biases = (None, None, None)
        if self.in_proj_bias is not None:
            biases = tuple(ops.getitem(self.in_proj_bias, third) for third in thirds)
        return tuple(
            ops.linear(x, w, b)
            for x, w, b in zip((query, key, value), weights, biases, strict=True)
        )

    # --- checks and masks -----------------------------------------------------------------
    def _label(self) -> str:
        return f"MultiheadAttention({self.extra_repr()})"

    def _check_inputs(self, query: Tensor, key: Tensor, value: Tensor) -> bool:
        """Check ranks, widths and lengths; True when the inputs are batched (3-d)."""
        layout = "(N, L, E)" if self.batch_first else "(L, N, E)"
        if query.ndim not in (2, 3):
            raise ValueError(
                f"{self._label()}: query must be {layout} or unbatched (L, E), got shape "
                f"{query.shape}"
            )
        for what, x, width in (
            ("query", query, self.embed_dim),
            ("key", key, self.kdim),
            ("value", value, self.vdim),
        ):
            if x.ndim != query.ndim:
                raise ValueError(
                    f"{self._label()}: query is {query.ndim}-d but {what} has shape {x.shape}"
                )
            if x.shape[-1] != width:
                setting = {"query": "embed_dim", "key": "kdim", "value": "vdim"}[what]
                raise ValueError(
                    f"{self._label()}: {what} must have {setting}={width} features, got shape "
                    f"{x.shape}"
                )
            if x.dtype != self.out_proj.weight.dtype:
                raise TypeError(
                    f"{self._label()}: {what} dtype {x.dtype} differs from the parameters' "
                    f"{self.out_proj.weight.dtype}; convert one with .to(dtype=...)"
                )
        length_axis = 1 if (query.ndim == 3 and self.batch_first) else 0
        if key.shape[length_axis] != value.shape[length_axis]:
            raise ValueError(
                f"{self._label()}: key and value must have the same sequence length, got "
                f"shapes {key.shape} and {value.shape}"
            )
        if query.ndim == 3:
            batch_axis = 1 - length_axis
            if not query.shape[batch_axis] == key.shape[batch_axis] == value.shape[batch_axis]:
                raise ValueError(
                    f"{self._label()}: query, key and value must have the same batch size, got "
                    f"shapes {query.shape}, {key.shape} and {value.shape}"
                )
        return query.ndim == 3

    def _additive_mask(self, attn_mask, key_padding_mask, is_causal, batched, like, sizes):
        """One float mask broadcastable to the scores ``(N, H, L, S)``, or None."""
        batch, target_length, source_length = sizes
        mask = None
        if attn_mask is None and is_causal:
            attn_mask = causal_mask(target_length, source_length)
        if attn_mask is not None:
            allowed = [
                (target_length, source_length),
                (batch * self.num_heads, target_length, source_length),
            ]
            values = _float_mask(attn_mask, "attn_mask", allowed, self._label(), like)
            if values.ndim == 3:
                values = values.reshape(batch, self.num_heads, target_length, source_length)
            mask = values
        if key_padding_mask is not None:
            expected = (batch, source_length) if batched else (source_length,)
            values = _float_mask(
                key_padding_mask, "key_padding_mask", [expected], self._label(), like
            )
            values = values.reshape(batch, 1, 1, source_length)
            mask = values if mask is None else mask + values
        return mask

    def extra_repr(self) -> str:
        text = f"embed_dim={self.embed_dim}, num_heads={self.num_heads}"
        if self.dropout:
            text += f", dropout={self.dropout}"
        if self.in_proj_bias is None:
            text += ", bias=False"
        if not self.same_embed_dim:
            text += f", kdim={self.kdim}, vdim={self.vdim}"
        if self.batch_first:
            text += ", batch_first=True"
        return text


def causal_mask(target_length: int, source_length: int) -> np.ndarray:
    """A bool ``(L, S)`` mask, True above the diagonal: position ``i`` may not see ``j > i``."""
    return np.triu(np.ones((target_length, source_length), dtype=bool), k=1)


def _as_tensor(x) -> Tensor:
    return x if isinstance(x, Tensor) else Tensor(x, _copy=False)


def _float_mask(mask, name: str, allowed_shapes: list, layer_label: str, like: Tensor):
    """A bool mask as 0 / -inf, or a float mask as is, on ``like``'s device and dtype."""
    array = mask.data if isinstance(mask, Tensor) else mask
    array = backend.to_device(array, like.device)
    if tuple(array.shape) not in allowed_shapes:
        shapes = " or ".join(str(shape) for shape in allowed_shapes)
        raise ValueError(
            f"{layer_label}: {name} must have shape {shapes}, got {tuple(array.shape)}"
        )
    if array.dtype == bool:
        xp = like.device.xp
        return xp.where(array, like.dtype.type(-np.inf), like.dtype.type(0))
    if not backend.is_floating(array.dtype):
        raise TypeError(
            f"{layer_label}: {name} must be bool or floating point, got dtype {array.dtype}"
        )
    return array.astype(like.dtype, copy=False)
