"""Functional API over Tensors: ``ops.add(a, b)``, ``ops.conv2d(x, w)``, ...

Each function applies one ``Function`` subclass; the classes live in files grouped by kind
(element-wise, activations, reductions, shapes, matmul, convolution, pooling, normalisation,
other layers' ops).
"""

from __future__ import annotations

from bigdl_py.autograd.ops import activation, elementwise, reduce
from bigdl_py.autograd.ops import matmul as matmul_ops
from bigdl_py.autograd.ops import shape as shape_ops


def add(a, b):
    return elementwise.Add.apply(a, b)


def sub(a, b):
    return elementwise.Sub.apply(a, b)


def mul(a, b):
    return elementwise.Mul.apply(a, b)


def div(a, b):
    return elementwise.Div.apply(a, b)


def neg(a):
    return elementwise.Neg.apply(a)


def pow(a, b):  # noqa: A001 - the natural name, as in torch.pow
    return elementwise.Pow.apply(a, b)


def exp(a):
    return elementwise.Exp.apply(a)


def log(a):
    return elementwise.Log.apply(a)


def sqrt(a):
    return elementwise.Sqrt.apply(a)


def abs(a):  # noqa: A001
    return elementwise.Abs.apply(a)


def clip(a, min_value=None, max_value=None):
    if min_value is None and max_value is None:
        raise ValueError("clip: give at least one of min_value and max_value")
    return elementwise.Clip.apply(a, low=min_value, high=max_value)


def maximum(a, b):
    return elementwise.Maximum.apply(a, b)


def where(condition, a, b):
    from bigdl_py.autograd.tensor import Tensor

    if isinstance(condition, Tensor):
        condition = condition.detach()
    return elementwise.Where.apply(condition, a, b)


def tanh(a):
    return activation.Tanh.apply(a)


def sigmoid(a):
    return activation.Sigmoid.apply(a)


def relu(a):
    return activation.ReLU.apply(a)


def leaky_relu(a, negative_slope: float = 0.01):
    return activation.LeakyReLU.apply(a, negative_slope=negative_slope)


def gelu(a, approximate: str = "none"):
    return activation.GELU.apply(a, approximate=approximate)


def softmax(a, axis: int = -1):
    return activation.Softmax.apply(a, axis=axis)


def log_softmax(a, axis: int = -1):
    return activation.LogSoftmax.apply(a, axis=axis)


def sum(a, axis=None, keepdims=False):  # noqa: A001
    return reduce.Sum.apply(a, axis=axis, keepdims=keepdims)


def mean(a, axis=None, keepdims=False):
    return reduce.Mean.apply(a, axis=axis, keepdims=keepdims)


def max(a, axis=None, keepdims=False):  # noqa: A001
    return reduce.Max.apply(a, axis=axis, keepdims=keepdims)


def min(a, axis=None, keepdims=False):  # noqa: A001
    return reduce.Min.apply(a, axis=axis, keepdims=keepdims)


def var(a, axis=None, keepdims=False, unbiased=False):
    """Variance, composed from mean so its gradient comes for free."""
    centered = a - mean(a, axis, keepdims=True)
    squared = centered * centered
    if not unbiased:
        return mean(squared, axis, keepdims)
    axes = reduce.normalize_axes(axis, a.ndim, "var")
    count = 1
    for ax in axes:
        count *= a.shape[ax]
    return sum(squared, axis, keepdims) / (count - 1)


def reshape(a, shape):
    return shape_ops.Reshape.apply(a, shape=tuple(shape))


def permute(a, axes=None):
    return shape_ops.Permute.apply(a, axes=axes)


def transpose(a, axes=None):
    return shape_ops.Permute.apply(a, axes=axes)


def getitem(a, index):
    return shape_ops.GetItem.apply(a, index=index)


def concatenate(tensors, axis: int = 0):
    return shape_ops.Concatenate.apply(*tensors, axis=axis)


def stack(tensors, axis: int = 0):
    return shape_ops.Stack.apply(*tensors, axis=axis)


def broadcast_to(a, shape):
    return shape_ops.BroadcastTo.apply(a, shape=tuple(shape))


def astype(a, dtype):
    return shape_ops.AsType.apply(a, dtype=dtype)


def to_device(a, target):
    from bigdl_py import backend

    return shape_ops.ToDevice.apply(a, target=backend.device(target))


def matmul(a, b):
    return matmul_ops.MatMul.apply(a, b)


def linear(x, weight, bias=None):
    if bias is None:
        return matmul_ops.Linear.apply(x, weight)
    return matmul_ops.Linear.apply(x, weight, bias)


# Ops of layers (convolution, pooling, normalisation, dropout, embedding) are added below by
# their own modules; see conv.py, pool.py, norm.py, misc.py.
from bigdl_py.autograd.ops.attention import *  # noqa: E402,F401,F403
from bigdl_py.autograd.ops.channel_dropout import *  # noqa: E402,F401,F403
from bigdl_py.autograd.ops.functional_layers import *  # noqa: E402,F401,F403
from bigdl_py.autograd.ops.group_norm import *  # noqa: E402,F401,F403
from bigdl_py.autograd.ops.rectifier import *  # noqa: E402,F401,F403
from bigdl_py.autograd.ops.resample import *  # noqa: E402,F401,F403
