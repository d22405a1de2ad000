"""Transformer encoder: ``TransformerEncoderLayer`` and a stack of them, ``TransformerEncoder``.

Both follow PyTorch's ``nn.TransformerEncoderLayer`` / ``nn.TransformerEncoder``: the same
arguments and the same sub-module names (``self_attn``, ``linear1``, ``linear2``, ``norm1``,
``norm2``; ``layers.0``, ``layers.1``, ..., ``norm``), so a PyTorch ``state_dict`` loads by
name. PyTorch's fused inference fast path is not reproduced; the results are the same.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bigdl_py.autograd import ops
from bigdl_py.nn.attention import MultiheadAttention, causal_mask
from bigdl_py.nn.containers import ModuleList
from bigdl_py.nn.layers._arguments import (
    check_flag,
    check_positive_int,
    check_probability,
    check_real,
)
from bigdl_py.nn.layers._base import check_floating_input, deep_copies
from bigdl_py.nn.layers.dropout import Dropout
from bigdl_py.nn.layers.linear import Linear
from bigdl_py.nn.layers.normalization import LayerNorm
from bigdl_py.nn.module import Module

__all__ = ["TransformerEncoder", "TransformerEncoderLayer", "generate_square_subsequent_mask"]

_ACTIVATIONS = {"relu": ops.relu, "gelu": ops.gelu}


class TransformerEncoderLayer(Module):
    """Self-attention then a feed-forward network, each with a residual and a LayerNorm.

    With ``norm_first=False`` (post-norm, the default)::

        x = norm1(x + dropout1(self_attn(x, x, x)))
        x = norm2(x + dropout2(linear2(dropout(activation(linear1(x))))))

    and with ``norm_first=True`` each block reads ``norm(x)`` and adds to ``x`` unnormalised.

    Parameters
    ----------
    d_model : int
        Width of the input and output.
    nhead : int
        Attention heads; must divide ``d_model``.
    dim_feedforward : int
        Width of the feed-forward network's hidden layer (default 2048).
    dropout : float
        Dropout on the attention weights, after each block, and inside the feed-forward
        network (default 0.1).
    activation : {"relu", "gelu"}
        Non-linearity of the feed-forward network (default "relu").
    layer_norm_eps : float
        ``eps`` of both LayerNorms (default 1e-5).
    batch_first : bool
        ``(N, L, E)`` input when True, ``(L, N, E)`` when False (the default, as PyTorch).
    norm_first : bool
        Pre-norm when True (default False).
    bias : bool
        Learn biases of the linear layers and the LayerNorms (default True).
    dtype : dtype or str, optional
        Parameter dtype (default float32).
    """

    def __init__(
        self,
        d_model: int,
        nhead: int,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        activation: str = "relu",
        layer_norm_eps: float = 1e-5,
        batch_first: bool = False,
        norm_first: bool = False,
        bias: bool = True,
        dtype: Any = None,
    ):
        super().__init__()
        name = "TransformerEncoderLayer"
        d_model = check_positive_int(d_model, "d_model", name)
        dim_feedforward = check_positive_int(dim_feedforward, "dim_feedforward", name)
        dropout = check_probability(dropout, "dropout", name)
        if activation not in _ACTIVATIONS:
            raise ValueError(
                f"{name}: activation must be one of {sorted(_ACTIVATIONS)}, got {activation!r}"
            )
        self.activation = activation
        layer_norm_eps = check_real(layer_norm_eps, "layer_norm_eps", name, above=0)
        self.norm_first = check_flag(norm_first, "norm_first", name)
        self.batch_first = check_flag(batch_first, "batch_first", name)
        bias = check_flag(bias, "bias", name)
        # PyTorch's order of registration, hence its state_dict order.
        self.self_attn = MultiheadAttention(
            d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first, dtype=dtype
        )
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, dtype=dtype)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, dtype=dtype)
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, dtype=dtype)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)

    def forward(self, src, src_mask=None, src_key_padding_mask=None, is_causal: bool = False):
        """Encode ``src``.

        Parameters
        ----------
        src : Tensor
            ``(L, N, d_model)``, ``(N, L, d_model)`` with ``batch_first``, or ``(L, d_model)``.
        src_mask : array or Tensor, optional
            ``attn_mask`` of the self-attention (see :class:`MultiheadAttention`).
        src_key_padding_mask : array or Tensor, optional
            ``(N, L)``: True (or ``-inf``) marks padding positions no query attends to.
        is_causal : bool
            Causal self-attention; with no ``src_mask`` the mask is built.

        Returns
        -------
        Tensor
            Shaped like ``src``.
        """
        check_floating_input(self, src)  # else the error would name an inner layer
        x = src
        if self.norm_first:
            x = x + self._attention_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            return x + self._feed_forward_block(self.norm2(x))
        x = self.norm1(x + self._attention_block(x, src_mask, src_key_padding_mask, is_causal))
        return self.norm2(x + self._feed_forward_block(x))

    def _attention_block(self, x, attn_mask, key_padding_mask, is_causal):
        attended, _ = self.self_attn(
            x,
            x,
            x,
            attn_mask=attn_mask,
            key_padding_mask=key_padding_mask,
            need_weights=False,
            is_causal=is_causal,
        )
        return self.dropout1(attended)

    def _feed_forward_block(self, x):
        hidden = self.dropout(_ACTIVATIONS[self.activation](self.linear1(x)))
        return self.dropout2(self.linear2(hidden))

    def extra_repr(self) -> str:
        attention = self.self_attn
        text = (
            f"d_model={attention.embed_dim}, nhead={attention.num_heads}, "
            f"dim_feedforward={self.linear1.out_features}, dropout={self.dropout.p}, "
            f"activation={self.activation!r}"
        )
        if self.norm_first:
            text += ", norm_first=True"
        if self.batch_first:
            text += ", batch_first=True"
        return text


class TransformerEncoder(Module):
    """``num_layers`` copies of an encoder layer, applied in turn, then an optional norm.

    Parameters
    ----------
    encoder_layer : TransformerEncoderLayer
        The layer to copy: each of ``layers.0 .. layers.{num_layers - 1}`` is a deep copy of
        it (so they start with the same weights, as in PyTorch); ``encoder_layer`` itself is
        not part of the model.
    num_layers : int
        How many layers to stack.
    norm : Module, optional
        Applied to the last layer's output (e.g. a ``LayerNorm`` with ``norm_first`` layers).
    enable_nested_tensor, mask_check : bool
        Accepted so PyTorch code runs unchanged; they steer PyTorch's inference fast path,
        which has no counterpart here, and change no result.
    """

    def __init__(
        self,
        encoder_layer: Module,
        num_layers: int,
        norm: Module | None = None,
        enable_nested_tensor: bool = True,
        mask_check: bool = True,
    ):
        super().__init__()
        if not isinstance(encoder_layer, Module):
            raise TypeError(
                f"TransformerEncoder: encoder_layer must be a Module, got "
                f"{type(encoder_layer).__name__}"
            )
        self.num_layers = check_positive_int(num_layers, "num_layers", "TransformerEncoder")
        for flag, value in (
            ("enable_nested_tensor", enable_nested_tensor),
            ("mask_check", mask_check),
        ):
            check_flag(value, flag, "TransformerEncoder")  # unused, but a typo is still refused
        self.layers = ModuleList(deep_copies(encoder_layer, self.num_layers))
        if norm is not None and not isinstance(norm, Module):
            raise TypeError(
                f"TransformerEncoder: norm must be a Module or None, got {type(norm).__name__}"
            )
        self.add_module("norm", norm)  # None stays readable as ``self.norm``, as in PyTorch

    def forward(self, src, mask=None, src_key_padding_mask=None, is_causal: bool | None = None):
        """Run ``src`` through every layer (arguments as for :class:`TransformerEncoderLayer`).

        ``is_causal=None`` (the default) means False.
        """
        x = src
        for layer in self.layers:
            x = layer(
                x,
                src_mask=mask,
                src_key_padding_mask=src_key_padding_mask,
                is_causal=bool(is_causal),
            )
        return x if self.norm is None else self.norm(x)

    def extra_repr(self) -> str:
        return f"num_layers={self.num_layers}"


def generate_square_subsequent_mask(size: int, dtype: Any = np.float32) -> np.ndarray:
    """A float ``(size, size)`` causal mask: ``-inf`` above the diagonal, 0 elsewhere.

    PyTorch's ``nn.Transformer.generate_square_subsequent_mask``; pass it as ``mask``.
    """
    size = check_positive_int(size, "size", "generate_square_subsequent_mask")
    return np.where(causal_mask(size, size), -np.inf, 0.0).astype(dtype)
