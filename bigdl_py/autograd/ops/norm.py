"""Batch and layer normalisation, each one fused op with an analytic backward.

Composing them from mean/var/sub/div would record about ten graph nodes and keep as many
temporaries alive; the fused backward needs only the normalised input and ``1/std``.
"""

from __future__ import annotations

from bigdl_py import backend
from bigdl_py.autograd.function import Function


def buffer_array(buffer):
    """The array of a running-stat buffer given as a Tensor or an array (or None)."""
    from bigdl_py.autograd.tensor import Tensor

    return buffer.data if isinstance(buffer, Tensor) else buffer


def _scale_and_shift(normalized, weight, bias, affine_shape):
    """``normalized * weight + bias`` in a new array (``normalized`` is saved for backward)."""
    if weight is None:
        output = normalized.copy()
    else:
        output = normalized * weight.reshape(affine_shape)
    if bias is not None:
        output += bias.reshape(affine_shape)
    return output


class BatchNorm(Function):
    """Normalise each channel (axis 1) over the batch and spatial axes.

    Inputs are ``x`` followed by ``weight`` and/or ``bias`` when given (``affine`` says which).
    """

    def forward(
        self,
        x,
        *affine_arrays,
        affine=(False, False),
        running_mean=None,
        running_var=None,
        training=True,
        momentum=0.1,
        eps=1e-5,
    ):
        xp = backend.array_module(x)
        if x.ndim < 2:
            raise ValueError(
                f"batch_norm: input must be at least 2-d (N, C, ...), got shape {tuple(x.shape)}"
            )
        channels = x.shape[1]
        weight, bias = _split_affine(affine_arrays, affine)
        for name, value in (
            ("running_mean", running_mean),
            ("running_var", running_var),
            ("weight", weight),
            ("bias", bias),
        ):
            if value is not None and tuple(value.shape) != (channels,):
                raise ValueError(
                    f"batch_norm: {name} must have shape ({channels},) for input of shape "
                    f"{tuple(x.shape)}, got {tuple(value.shape)}"
                )
        axes = (0,) + tuple(range(2, x.ndim))
        per_channel = (1, channels) + (1,) * (x.ndim - 2)
        count = x.size // channels
        if training:
            if count < 2:
                raise ValueError(
                    f"batch_norm: training needs more than one value per channel, got input "
                    f"of shape {tuple(x.shape)}"
                )
            mean = x.mean(axis=axes)
            centered = x - mean.reshape(per_channel)
            # Biased variance normalises (as PyTorch does); the running estimate is unbiased.
            variance = (centered * centered).mean(axis=axes)
            if running_mean is not None:
                _update_in_place(running_mean, mean, momentum)
            if running_var is not None:
                _update_in_place(running_var, variance * (count / (count - 1)), momentum)
        else:
            if running_mean is None or running_var is None:
                raise ValueError(
                    "batch_norm: evaluation (training=False) needs running_mean and running_var"
                )
            mean = running_mean.astype(x.dtype, copy=False)
            variance = running_var.astype(x.dtype, copy=False)
            centered = x - mean.reshape(per_channel)
        inv_std = (1.0 / xp.sqrt(variance + eps)).astype(x.dtype, copy=False)
        normalized = centered
        normalized *= inv_std.reshape(per_channel)  # centered is ours: reuse its memory
        output = _scale_and_shift(normalized, weight, bias, per_channel)
        self.training = training
        self.affine = affine
        self.layout = (axes, per_channel, count)
        self.save_for_backward(normalized, inv_std, weight)
        return output

    def backward(self, grad):
        normalized, inv_std, weight = self.saved
        axes, per_channel, count = self.layout
        grad_weight = grad_bias = None
        if self.affine[0] and self.needs_input_grad[1]:
            grad_weight = (grad * normalized).sum(axis=axes)
        if self.affine[1] and self.needs_input_grad[1 + self.affine[0]]:
            grad_bias = grad.sum(axis=axes)
        grad_x = None
        if self.needs_input_grad[0]:
            scale = inv_std if weight is None else inv_std * weight
            if self.training:
                # d/dx of (x - mean) / std with batch statistics: remove the gradient's mean
                # and its projection on the normalised input, per channel.
                grad_sum = grad_bias if grad_bias is not None else grad.sum(axis=axes)
                grad_dot = (
                    grad_weight if grad_weight is not None else (grad * normalized).sum(axis=axes)
                )
                grad_x = grad - (grad_sum / count).reshape(per_channel)
                grad_x -= normalized * (grad_dot / count).reshape(per_channel)
                grad_x *= scale.reshape(per_channel)
            else:
                grad_x = grad * scale.reshape(per_channel)
        gradients = [grad_x]
        if self.affine[0]:
            gradients.append(grad_weight)
        if self.affine[1]:
            gradients.append(grad_bias)
        return tuple(gradients)


class LayerNorm(Function):
    """Normalise over the last ``len(normalized_shape)`` axes of each sample."""

    def forward(self, x, *affine_arrays, affine=(False, False), normalized_shape=(), eps=1e-5):
        xp = backend.array_module(x)
        count_axes = len(normalized_shape)
        if count_axes == 0 or tuple(x.shape[-count_axes:]) != tuple(normalized_shape):
            raise ValueError(
                f"layer_norm: normalized_shape {tuple(normalized_shape)} does not match the "
                f"trailing axes of input shape {tuple(x.shape)}"
            )
        weight, bias = _split_affine(affine_arrays, affine)
        for name, value in (("weight", weight), ("bias", bias)):
            if value is not None and tuple(value.shape) != tuple(normalized_shape):
                raise ValueError(
                    f"layer_norm: {name} must have shape {tuple(normalized_shape)}, got "
                    f"{tuple(value.shape)}"
                )
        axes = tuple(range(x.ndim - count_axes, x.ndim))
        mean = x.mean(axis=axes, keepdims=True)
        normalized = x - mean
        variance = (normalized * normalized).mean(axis=axes, keepdims=True)
        inv_std = (1.0 / xp.sqrt(variance + eps)).astype(x.dtype, copy=False)
        normalized *= inv_std
        output = _scale_and_shift(normalized, weight, bias, normalized_shape)
        self.affine = affine
        self.axes = axes
        self.save_for_backward(normalized, inv_std, weight)
        return output

    def backward(self, grad):
        normalized, inv_std, weight = self.saved
        leading = tuple(range(grad.ndim - len(self.axes)))
        gradients = []
        if self.needs_input_grad[0]:
            grad_normalized = grad if weight is None else grad * weight
            # Per sample: subtract the mean gradient and its projection on the normalised input.
            grad_x = grad_normalized - grad_normalized.mean(axis=self.axes, keepdims=True)
            projection = (grad_normalized * normalized).mean(axis=self.axes, keepdims=True)
            grad_x -= normalized * projection
            grad_x *= inv_std
            gradients.append(grad_x)
        else:
            gradients.append(None)
        if self.affine[0]:
            gradients.append((grad * normalized).sum(axis=leading))
        if self.affine[1]:
            gradients.append(grad.sum(axis=leading))
        return tuple(gradients)


def _split_affine(arrays, affine):
    """Map the positional affine arrays back to (weight, bias), either possibly None."""
    arrays = list(arrays)
    weight = arrays.pop(0) if affine[0] else None
    bias = arrays.pop(0) if affine[1] else None
    return weight, bias


def _update_in_place(buffer, batch_value, momentum: float) -> None:
    """``buffer = (1 - momentum) * buffer + momentum * batch_value``, keeping the same array."""
    buffer *= 1 - momentum
    buffer += (momentum * batch_value).astype(buffer.dtype, copy=False)
