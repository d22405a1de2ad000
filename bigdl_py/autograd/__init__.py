"""Define-by-run automatic differentiation: Tensor, Function, no_grad, gradcheck."""

from bigdl_py.autograd import ops
from bigdl_py.autograd.function import Function
from bigdl_py.autograd.grad_mode import enable_grad, is_grad_enabled, no_grad
from bigdl_py.autograd.gradcheck import gradcheck
from bigdl_py.autograd.tensor import Tensor, ones, tensor, zeros

__all__ = [
    "Function",
    "Tensor",
    "enable_grad",
    "gradcheck",
    "is_grad_enabled",
    "no_grad",
    "ones",
    "ops",
    "tensor",
    "zeros",
]
