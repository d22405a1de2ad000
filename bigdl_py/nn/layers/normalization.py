"""Batch, layer, group and instance normalisation (BigDL's ``BatchNormalization``,
``SpatialBatchNormalization``, ``LayerNormalization``; PyTorch's ``GroupNorm`` and
``InstanceNorm2d``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from bigdl_py import backend
from bigdl_py.autograd import ops
from bigdl_py.nn import init
from bigdl_py.nn.layers._arguments import (
    check_flag,
    check_positive_int,
    check_probability,
    check_real,
)
from bigdl_py.nn.layers._base import (
    check_floating_input,
    check_ndim,
    empty_parameter,
    filled_buffer,
    label,
    parameter_dtype,
)
from bigdl_py.nn.module import Module

__all__ = ["BatchNorm1d", "BatchNorm2d", "GroupNorm", "InstanceNorm2d", "LayerNorm"]


class _NormBase(Module):
    """Per-channel affine parameters and running statistics: batch and instance norms."""

    _ranks: tuple[int, ...] = ()
    _layout = ""

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        dtype: Any = None,
    ):
        super().__init__()
        name = type(self).__name__
        self.num_features = check_positive_int(num_features, "num_features", name)
        self.eps = check_real(eps, "eps", name, above=0)
        self.momentum = check_probability(momentum, "momentum", name, none_allowed=True)
        self.affine = check_flag(affine, "affine", name)
        self.track_running_stats = check_flag(track_running_stats, "track_running_stats", name)
        dtype = parameter_dtype(dtype, name)
        if self.affine:
            self.weight = empty_parameter((self.num_features,), dtype)
            self.bias = empty_parameter((self.num_features,), dtype)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        if self.track_running_stats:
            self.register_buffer("running_mean", filled_buffer((self.num_features,), 0, dtype))
            self.register_buffer("running_var", filled_buffer((self.num_features,), 1, dtype))
            # Counted as in PyTorch (so its state dicts load) and used when momentum is None.
            self.register_buffer("num_batches_tracked", filled_buffer((), 0, np.int64))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)
        self.reset_parameters()

    def reset_running_stats(self) -> None:
        """Running mean 0, running variance 1, no batches seen."""
        if self.track_running_stats:
            init.zeros_(self.running_mean)
            init.ones_(self.running_var)
            self.num_batches_tracked.data[...] = 0

    def reset_parameters(self) -> None:
        """Scale 1 and shift 0 (the identity on normalised input), fresh running statistics."""
        self.reset_running_stats()
        if self.affine:
            init.ones_(self.weight)
            init.zeros_(self.bias)

    def _check_input(self, x) -> None:
        check_ndim(self, x, self._ranks, self._layout)
        check_floating_input(self, x)
        if x.shape[1] != self.num_features:
            raise ValueError(
                f"{label(self)}: input has {x.shape[1]} channels (shape {tuple(x.shape)}); "
                f"expected {self.num_features}"
            )

    def extra_repr(self) -> str:
        return (
            f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, "
            f"affine={self.affine}, track_running_stats={self.track_running_stats}"
        )


class _BatchNorm(_NormBase):
    """Batch normalisation over axis 1; subclasses fix which input ranks are accepted."""

    def forward(self, x):
        self._check_input(x)
        momentum = self.momentum
        if self.training and self.track_running_stats:
            self.num_batches_tracked.data += 1
            if momentum is None:  # a cumulative moving average of every batch so far
                count = self.num_batches_tracked.data
                # On a device the factor stays there: reading the count would wait for it.
                momentum = 1.0 / (count if backend.is_device_array(count) else float(count))
        # Without running statistics there is nothing else to normalise with, even in eval.
        use_batch_statistics = self.training or not self.track_running_stats
        return ops.batch_norm(
            x,
            self.running_mean if self.track_running_stats else None,
            self.running_var if self.track_running_stats else None,
            self.weight,
            self.bias,
            training=use_batch_statistics,
            momentum=0.0 if momentum is None else momentum,
            eps=self.eps,
        )


class BatchNorm1d(_BatchNorm):
    """Batch normalisation of ``(N, C)`` or ``(N, C, L)`` input, per feature ``C``.

    Parameters
    ----------
    num_features : int
        ``C``.
    eps : float
        Added to the variance before the square root (default 1e-5).
    momentum : float or None
        Weight of the current batch in the running statistics (default 0.1); ``None``
        keeps a cumulative average over all batches.
    affine : bool
        Learn a per-feature scale ``weight`` (init 1) and shift ``bias`` (init 0).
    track_running_stats : bool
        Keep ``running_mean``/``running_var`` buffers for evaluation; without them
        evaluation normalises with the batch's own statistics.
    dtype : dtype or str, optional
        Dtype of parameters and running statistics (default float32).

    Notes
    -----
    Training normalises with the batch's biased variance and updates the running variance
    with the unbiased one, as PyTorch does. BigDL's ``momentum`` has the same meaning.
    """

    _ranks = (2, 3)
    _layout = "(N, C) or (N, C, L)"


class BatchNorm2d(_BatchNorm):
    """Batch normalisation of ``(N, C, H, W)`` input, per channel; arguments as
    :class:`BatchNorm1d`."""

    _ranks = (4,)
    _layout = "(N, C, H, W)"


class LayerNorm(Module):
    """Normalise each sample over its trailing ``normalized_shape`` axes.

    Parameters
    ----------
    normalized_shape : int or sequence of int
        The trailing input shape to normalise over.
    eps : float
        Added to the variance (default 1e-5).
    elementwise_affine : bool
        Learn a scale ``weight`` (init 1) of shape ``normalized_shape``.
    bias : bool
        With ``elementwise_affine``, also learn a shift ``bias`` (init 0).
    dtype : dtype or str, optional
        Parameter dtype (default float32).
    """

    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        dtype: Any = None,
    ):
        super().__init__()
        if isinstance(normalized_shape, (int, np.integer)):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(
            check_positive_int(size, "normalized_shape", "LayerNorm") for size in normalized_shape
        )
        if not self.normalized_shape:
            raise ValueError("LayerNorm: normalized_shape must name at least one axis")
        self.eps = check_real(eps, "eps", "LayerNorm", above=0)
        self.elementwise_affine = check_flag(elementwise_affine, "elementwise_affine", "LayerNorm")
        bias = check_flag(bias, "bias", "LayerNorm")
        dtype = parameter_dtype(dtype, "LayerNorm")
        if self.elementwise_affine:
            self.weight = empty_parameter(self.normalized_shape, dtype)
        else:
            self.register_parameter("weight", None)
        if self.elementwise_affine and bias:
            self.bias = empty_parameter(self.normalized_shape, dtype)
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            init.ones_(self.weight)
        if self.bias is not None:
            init.zeros_(self.bias)

    def forward(self, x):
        check_floating_input(self, x)
        count = len(self.normalized_shape)
        shape = tuple(x.shape)
        if shape[len(shape) - count :] != self.normalized_shape:
            raise ValueError(
                f"{label(self)}: input shape {shape} does not end with normalized_shape "
                f"{self.normalized_shape}"
            )
        return ops.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return (
            f"{self.normalized_shape}, eps={self.eps}, "
            f"elementwise_affine={self.elementwise_affine}, bias={self.bias is not None}"
        )


class InstanceNorm2d(_NormBase):
    """Normalise each channel of each sample over its ``(H, W)`` positions.

    Parameters
    ----------
    num_features : int
        ``C``.
    eps : float
        Added to the variance before the square root (default 1e-5).
    momentum : float or None
        Weight of the current batch in the running statistics (default 0.1). ``None``
        leaves them unchanged, as in PyTorch (instance norm keeps no cumulative average).
    affine : bool
        Learn a per-channel scale ``weight`` (init 1) and shift ``bias`` (init 0); default
        False, as in PyTorch.
    track_running_stats : bool
        Default False: every call normalises with the instance's own statistics. With True
        training also updates ``running_mean``/``running_var`` (the batch average of the
        per-instance mean and unbiased variance) and evaluation normalises with them.
    dtype : dtype or str, optional
        Dtype of parameters and running statistics (default float32).

    Notes
    -----
    Input ``(N, C, H, W)``, or ``(C, H, W)`` for one sample. ``num_batches_tracked`` is kept
    for PyTorch's state-dict keys and, like PyTorch's, never counts.
    """

    _ranks = (3, 4)
    _layout = "(N, C, H, W) or (C, H, W)"

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = False,
        track_running_stats: bool = False,
        dtype: Any = None,
    ):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, dtype)

    def forward(self, x):
        check_ndim(self, x, self._ranks, self._layout)
        check_floating_input(self, x)
        shape = tuple(x.shape)
        if shape[-3] != self.num_features:
            raise ValueError(
                f"{label(self)}: input has {shape[-3]} channels (shape {shape}, layout "
                f"{self._layout}); expected {self.num_features}"
            )
        unbatched = len(shape) == 3
        batched = ops.reshape(x, (1,) + shape) if unbatched else x
        use_input_stats = self.training or not self.track_running_stats
        # One value per channel normalises to 0 whatever it is: PyTorch refuses it too.
        if use_input_stats and batched.shape[2] * batched.shape[3] < 2:
            raise ValueError(
                f"{label(self)}: needs more than one spatial value per channel to normalise "
                f"with the input's statistics, got input of shape {shape}"
            )
        output = ops.instance_norm(
            batched,
            self.running_mean,
            self.running_var,
            self.weight,
            self.bias,
            use_input_stats=use_input_stats,
            momentum=0.0 if self.momentum is None else self.momentum,
            eps=self.eps,
        )
        return ops.reshape(output, shape) if unbatched else output


class GroupNorm(Module):
    """Normalise each sample's channels in ``num_groups`` groups, each over its channels and
    positions, then scale and shift per channel.

    Parameters
    ----------
    num_groups : int
        Must divide ``num_channels``. 1 normalises all channels together (like
        :class:`LayerNorm` over ``(C, H, W)`` with per-channel affine), ``num_channels``
        each on its own (like :class:`InstanceNorm2d`).
    num_channels : int
        ``C``.
    eps : float
        Added to the variance (default 1e-5).
    affine : bool
        Learn a per-channel ``weight`` (init 1) and ``bias`` (init 0); default True.
    dtype : dtype or str, optional
        Parameter dtype (default float32).

    Notes
    -----
    Input ``(N, C, ...)``. No running statistics: training and evaluation compute alike,
    and results do not depend on the batch size.
    """

    def __init__(
        self,
        num_groups: int,
        num_channels: int,
        eps: float = 1e-5,
        affine: bool = True,
        dtype: Any = None,
    ):
        super().__init__()
        self.num_groups = check_positive_int(num_groups, "num_groups", "GroupNorm")
        self.num_channels = check_positive_int(num_channels, "num_channels", "GroupNorm")
        if self.num_channels % self.num_groups:
            raise ValueError(
                f"GroupNorm: num_groups={num_groups} must divide num_channels={num_channels}"
            )
        self.eps = check_real(eps, "eps", "GroupNorm", above=0)
        self.affine = check_flag(affine, "affine", "GroupNorm")
        dtype = parameter_dtype(dtype, "GroupNorm")
        if self.affine:
            self.weight = empty_parameter((self.num_channels,), dtype)
            self.bias = empty_parameter((self.num_channels,), dtype)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Scale 1 and shift 0."""
        if self.affine:
            init.ones_(self.weight)
            init.zeros_(self.bias)

    def forward(self, x):
        shape = tuple(x.shape)
        check_floating_input(self, x)
        if len(shape) < 2 or shape[1] != self.num_channels:
            raise ValueError(
                f"{label(self)}: expects (N, {self.num_channels}, ...) input, got shape {shape}"
            )
        return ops.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}"
