"""Group and instance normalisation: one fused op that normalises each sample's channel groups.

Group normalisation splits the ``C`` channels of each sample into ``G`` groups and
normalises each group over its channels and spatial positions; instance normalisation is
the case ``G = C`` (each channel of each sample on its own). Both then scale and shift per
channel. The fused backward is layer normalisation's, per group: it needs only the
normalised input and ``1/std`` (see norm.py for why ops like these are fused).
"""

from __future__ import annotations

import numpy as np

from bigdl_py import backend
from bigdl_py.autograd.function import Function
from bigdl_py.autograd.ops import cublas, norm
from bigdl_py.autograd.ops.functional_layers import batch_norm

__all__ = ["group_norm", "instance_norm"]


class GroupNorm(Function):
    """Normalise ``x (N, C, ...)`` over each of ``num_groups`` channel groups per sample.

    Inputs are ``x`` followed by ``weight`` and/or ``bias`` of shape ``(C,)`` when given
    (``affine`` says which).
    """

    def forward(self, x, *affine_arrays, affine=(False, False), num_groups=1, eps=1e-5):
        xp = backend.array_module(x)
        if x.ndim < 2:
            raise ValueError(
                f"group_norm: input must be at least 2-d (N, C, ...), got shape {tuple(x.shape)}"
            )
        backend.check_floating(x.dtype, "group_norm")
        batch, channels = x.shape[:2]
        if num_groups < 1 or channels % num_groups:
            raise ValueError(
                f"group_norm: num_groups {num_groups} must divide the {channels} channels of "
                f"input shape {tuple(x.shape)}"
            )
        weight, bias = norm._split_affine(affine_arrays, affine)
        for name, value in (("weight", weight), ("bias", bias)):
            if value is not None and tuple(value.shape) != (channels,):
                raise ValueError(
                    f"group_norm: {name} must have shape ({channels},) for input of shape "
                    f"{tuple(x.shape)}, got {tuple(value.shape)}"
                )
        grouped = x.reshape(batch, num_groups, -1)
        mean = grouped.mean(axis=2, keepdims=True)
        normalized = grouped - mean
        # Per-group sums of products as einsum: one pass, no product array (half the time
        # of multiply-then-sum here).
        variance = _group_dot(xp, normalized, normalized) / normalized.shape[2]
        inv_std = (1.0 / xp.sqrt(variance + eps)).astype(x.dtype, copy=False)
        normalized *= inv_std
        per_channel = (1, channels) + (1,) * (x.ndim - 2)
        output = norm._scale_and_shift(normalized.reshape(x.shape), weight, bias, per_channel)
        self.affine = affine
        self.layout = (num_groups, per_channel)
        self.save_for_backward(normalized, inv_std, weight)
        return output

    def backward(self, grad):
        normalized, inv_std, weight = self.saved
        num_groups, per_channel = self.layout
        xp = backend.array_module(grad)
        batch, channels = grad.shape[:2]
        gradients = [None]
        if self.needs_input_grad[0]:
            if weight is None:
                grouped = grad.reshape(batch, num_groups, -1)
                grad_x = grouped - grouped.mean(axis=2, keepdims=True)
            else:
                grouped = (grad * weight.reshape(per_channel)).reshape(batch, num_groups, -1)
                grad_x = grouped  # a fresh array: centre it in place
                grad_x -= grouped.mean(axis=2, keepdims=True)
            # Per group: remove the mean gradient (above) and the projection on the
            # normalised input. The projection is taken of the centred gradient; the
            # normalised input sums to zero per group, so that is the same projection.
            projection = _group_dot(xp, grad_x, normalized) / normalized.shape[2]
            grad_x -= normalized * projection
            grad_x *= inv_std
            gradients[0] = grad_x.reshape(grad.shape)
        # Parameter gradients sum over the batch and spatial axes, per channel.
        per_sample_channel = grad.reshape(batch, channels, -1)
        if self.affine[0]:
            normalized_by_channel = normalized.reshape(batch, channels, -1)
            if type(grad) is np.ndarray:
                dots = xp.einsum("ncl,ncl->c", per_sample_channel, normalized_by_channel)
            else:
                dots = _row_dots(per_sample_channel, normalized_by_channel).sum(axis=0)
            gradients.append(dots)
        if self.affine[1]:
            gradients.append(per_sample_channel.sum(axis=2).sum(axis=0))
        return tuple(gradients)


def _group_dot(xp, a, b):
    """``sum(a * b)`` over the last axis of ``(N, G, K)`` arrays, kept as ``(N, G, 1)``."""
    if type(a) is np.ndarray:
        return xp.einsum("ngk,ngk->ng", a, b)[..., None]
    return _row_dots(a, b)[..., None]


def _row_dots(a, b):
    """``sum(a * b)`` over the last axis of two ``(N, M, K)`` device arrays, ``(N, M)``: one
    strided-batched GEMM of ``(1, K) @ (K, 1)`` products on the package's cuBLAS handle
    (CuPy's ``einsum`` contracts on its own handle, which a CUDA graph cannot capture)."""
    return cublas.matmul(a[..., None, :], b[..., None])[..., 0, 0]


def group_norm(x, num_groups: int, weight=None, bias=None, eps: float = 1e-5):
    """Normalise each sample's ``num_groups`` channel groups, then scale and shift per channel.

    Parameters
    ----------
    x : Tensor
        Input of shape ``(N, C, ...)``.
    num_groups : int
        Must divide ``C``.
    weight, bias : Tensor of shape (C,), optional
    eps : float
        Added to the (biased) variance before the square root.
    """
    affine_inputs = [value for value in (weight, bias) if value is not None]
    return GroupNorm.apply(
        x,
        *affine_inputs,
        affine=(weight is not None, bias is not None),
        num_groups=int(num_groups),
        eps=eps,
    )


def instance_norm(
    x,
    running_mean=None,
    running_var=None,
    weight=None,
    bias=None,
    use_input_stats: bool = True,
    momentum: float = 0.1,
    eps: float = 1e-5,
):
    """Normalise each channel of each sample over its spatial axes (PyTorch's rules).

    Parameters
    ----------
    x : Tensor
        Input of shape ``(N, C, ...)`` with at least one spatial axis.
    running_mean, running_var : Tensor or array of shape (C,), optional
        With ``use_input_stats`` they are updated IN PLACE with the batch average of the
        per-instance mean and unbiased variance: ``running = (1 - momentum) * running +
        momentum * average``. Without it they normalise instead of the input's statistics.
    weight, bias : Tensor of shape (C,), optional
    use_input_stats : bool
        Normalise with each instance's own statistics (training, or no running statistics).
    momentum, eps : float
    """
    if x.ndim < 3:
        raise ValueError(
            f"instance_norm: input must be at least 3-d (N, C, ...), got shape {tuple(x.shape)}"
        )
    if not use_input_stats:
        # Fixed per-channel statistics: what batch normalisation does in evaluation.
        return batch_norm(x, running_mean, running_var, weight, bias, training=False, eps=eps)
    if running_mean is not None or running_var is not None:
        _update_running_stats(x, running_mean, running_var, momentum)
    return group_norm(x, x.shape[1], weight, bias, eps)


def _update_running_stats(x, running_mean, running_var, momentum: float) -> None:
    """Fold the batch's per-instance statistics into the running buffers, in place."""
    values = x.data.reshape(x.shape[0], x.shape[1], -1)
    if values.shape[2] < 2:
        raise ValueError(
            f"instance_norm: training needs more than one spatial value per channel, got "
            f"input of shape {tuple(x.shape)}"
        )
    if running_mean is not None:
        average_mean = values.mean(axis=2).mean(axis=0)
        norm._update_in_place(norm.buffer_array(running_mean), average_mean, momentum)
    if running_var is not None:
        # Unbiased per instance, as PyTorch's running variance is.
        average_variance = values.var(axis=2, ddof=1).mean(axis=0)
        norm._update_in_place(norm.buffer_array(running_var), average_variance, momentum)
