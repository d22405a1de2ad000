"""Element-wise arithmetic and math, each forward beside its gradient rule."""

from __future__ import annotations

from bigdl_py import backend
from bigdl_py.autograd.function import Function


def _broadcast_shape(op_name: str, a, b) -> None:
    """Raise a clear error naming the op and both shapes when they cannot broadcast."""
    xp = backend.array_module(a)
    try:
        xp.broadcast_shapes(a.shape, b.shape)
    except ValueError:
        raise ValueError(
            f"{op_name}: shapes {tuple(a.shape)} and {tuple(b.shape)} cannot be broadcast together"
        ) from None


class Add(Function):
    def forward(self, a, b):
        _broadcast_shape("add", a, b)
        return a + b

    def backward(self, grad):
        return grad, grad


class Sub(Function):
    def forward(self, a, b):
        _broadcast_shape("sub", a, b)
        return a - b

    def backward(self, grad):
        return grad, -grad


class Mul(Function):
    def forward(self, a, b):
        _broadcast_shape("mul", a, b)
        self.save_for_backward(a, b)
        return a * b

    def backward(self, grad):
        a, b = self.saved
        return (
            grad * b if self.needs_input_grad[0] else None,
            grad * a if self.needs_input_grad[1] else None,
        )


class Div(Function):
    def forward(self, a, b):
        _broadcast_shape("div", a, b)
        self.save_for_backward(a, b)
        return a / b

    def backward(self, grad):
        a, b = self.saved
        grad_a = grad / b if self.needs_input_grad[0] else None
        grad_b = -grad * a / (b * b) if self.needs_input_grad[1] else None
        return grad_a, grad_b


class Neg(Function):
    def forward(self, a):
        return -a

    def backward(self, grad):
        return -grad


class Pow(Function):
    """a ** b for a tensor base and a tensor (or scalar) exponent."""

    def forward(self, a, b):
        _broadcast_shape("pow", a, b)
        out = a**b
        self.save_for_backward(a, b, out)
        return out

    def backward(self, grad):
        a, b, out = self.saved
        xp = backend.array_module(a)
        grad_a = grad_b = None
        if self.needs_input_grad[0]:
            grad_a = grad * b * a ** (b - 1)
        if self.needs_input_grad[1]:
            # d(a^b)/db = a^b log a; defined as 0 where a == 0 (the limit for b > 0).
            safe_log = xp.log(xp.where(a > 0, a, 1))
            grad_b = grad * out * safe_log
        return grad_a, grad_b


class Exp(Function):
    def forward(self, a):
        out = backend.array_module(a).exp(a)
        self.save_for_backward(out)
        return out

    def backward(self, grad):
        (out,) = self.saved
        return grad * out


class Log(Function):
    def forward(self, a):
        self.save_for_backward(a)
        return backend.array_module(a).log(a)

    def backward(self, grad):
        (a,) = self.saved
        return grad / a


class Sqrt(Function):
    def forward(self, a):
        out = backend.array_module(a).sqrt(a)
        self.save_for_backward(out)
        return out

    def backward(self, grad):
        (out,) = self.saved
        return grad / (2 * out)


class Abs(Function):
    def forward(self, a):
        self.save_for_backward(a)
        return backend.array_module(a).abs(a)

    def backward(self, grad):
        (a,) = self.saved
        return grad * backend.array_module(a).sign(a)


class Clip(Function):
    """Clamp to [low, high]; the gradient passes only where the value was inside."""

    def forward(self, a, low=None, high=None):
        xp = backend.array_module(a)
        inside = xp.ones(a.shape, dtype=bool)
        if low is not None:
            inside &= a >= low
        if high is not None:
            inside &= a <= high
        self.save_for_backward(inside)
        return xp.clip(a, low, high)

    def backward(self, grad):
        (inside,) = self.saved
        return grad * inside


class Maximum(Function):
    """Element-wise max of two tensors; ties send the gradient to the first."""

    def forward(self, a, b):
        _broadcast_shape("maximum", a, b)
        self.save_for_backward(a >= b)
        return backend.array_module(a).maximum(a, b)

    def backward(self, grad):
        (first_wins,) = self.saved
        return grad * first_wins, grad * ~first_wins


class Where(Function):
    """``condition ? a : b``; the condition is a boolean array with no gradient."""

    differentiable_inputs = (1, 2)

    def forward(self, condition, a, b):
        xp = backend.array_module(a)
        condition = condition.astype(bool, copy=False)
        try:
            xp.broadcast_shapes(condition.shape, a.shape, b.shape)
        except ValueError:
            raise ValueError(
                f"where: shapes condition {tuple(condition.shape)}, a {tuple(a.shape)} and "
                f"b {tuple(b.shape)} cannot be broadcast together"
            ) from None
        self.save_for_backward(condition)
        return xp.where(condition, a, b)

    def backward(self, grad):
        (condition,) = self.saved
        return None, grad * condition, grad * ~condition
