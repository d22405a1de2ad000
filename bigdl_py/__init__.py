"""bigdl_py: deep learning inside Apache Spark jobs, in Python, in the style of BigDL."""

from bigdl_py import backend
from bigdl_py.autograd import Tensor, enable_grad, no_grad, ones, tensor, zeros
from bigdl_py.autograd import ops as functional
from bigdl_py.backend import device

__version__ = "0.1.0"

__all__ = [
    "Tensor",
    "backend",
    "device",
    "enable_grad",
    "functional",
    "no_grad",
    "ones",
    "tensor",
    "zeros",
]
