"""Parameter initialisers (PyTorch's ``torch.nn.init`` names) and seeded model building.

Every initialiser fills a ``Tensor``/``Parameter`` IN PLACE (the array object is kept, so a
parameter that is already a view into a flat buffer stays one) and returns it.

Random values are drawn on the host in float64 from a NumPy ``Generator`` and then cast to
the parameter's dtype and copied to its device. Two consequences that the rest of the
package relies on:

* one seed gives the same model on every machine, CPU or GPU — the distributed trainer
  builds one replica per partition and needs them identical before the first step;
* a float32 and a float64 build of one model with one seed differ only by rounding, which
  is what the float64 parity tests use.

``generator=None`` means this module's default generator; ``manual_seed(seed)`` resets it
and ``seeded(seed)`` swaps it for the length of a ``with`` block::

    with nn.init.seeded(42):
        model = build_model()          # identical weights every time
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import numpy as np

from bigdl_py import backend
from bigdl_py.autograd.tensor import Tensor

__all__ = [
    "calculate_gain",
    "constant_",
    "default_generator",
    "fan_in_and_fan_out",
    "kaiming_normal_",
    "kaiming_uniform_",
    "manual_seed",
    "normal_",
    "ones_",
    "seeded",
    "uniform_",
    "xavier_normal_",
    "xavier_uniform_",
    "zeros_",
]

_default_generator = np.random.default_rng()

_LINEAR_NONLINEARITIES = (
    "linear",
    "identity",
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_transpose1d",
    "conv_transpose2d",
    "conv_transpose3d",
    "sigmoid",
)


# --- the default generator ----------------------------------------------------------------
def manual_seed(seed: int) -> np.random.Generator:
    """Reset the default generator of every initialiser (and so of every layer's init).

    Parameters
    ----------
    seed : int
        Any non-negative integer accepted by ``numpy.random.default_rng``.

    Returns
    -------
    numpy.random.Generator
        The new default generator.
    """
    global _default_generator
    _default_generator = np.random.default_rng(seed)
    return _default_generator


def default_generator() -> np.random.Generator:
    """The generator initialisers use when they are given none."""
    return _default_generator


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[np.random.Generator]:
    """Use a generator seeded with ``seed`` as the default inside a ``with`` block.

    The previous default generator (and its position in its stream) is restored on exit,
    so seeding one model's build does not change what later, unseeded builds draw.
    """
    global _default_generator
    previous = _default_generator
    _default_generator = np.random.default_rng(seed)
    try:
        yield _default_generator
    finally:
        _default_generator = previous


# --- fans and gains -------------------------------------------------------------------------
def fan_in_and_fan_out(tensor: Tensor) -> tuple[int, int]:
    """``(fan_in, fan_out)`` of a weight laid out as ``(out, in, *kernel)`` (PyTorch's layout).

    Raises
    ------
    ValueError
        For tensors with fewer than two dimensions (a bias has no fan-in and fan-out).
    """
    shape = tensor.shape
    if len(shape) < 2:
        raise ValueError(
            f"fan in and fan out need a tensor with at least 2 dimensions, got shape {shape}"
        )
    receptive_field = math.prod(shape[2:])
    return shape[1] * receptive_field, shape[0] * receptive_field


def calculate_gain(nonlinearity: str, param: float | None = None) -> float:
    """The recommended gain for a nonlinearity, as in ``torch.nn.init.calculate_gain``.

    Parameters
    ----------
    nonlinearity : str
        ``'linear'``, a conv name, ``'sigmoid'`` (gain 1), ``'tanh'`` (5/3), ``'relu'``
        (sqrt 2), ``'leaky_relu'`` (sqrt(2 / (1 + slope**2))) or ``'selu'`` (3/4).
    param : float, optional
        The negative slope of ``'leaky_relu'`` (default 0.01).

    Raises
    ------
    ValueError
        For an unknown nonlinearity or a slope that is not a number.
    """
    if nonlinearity in _LINEAR_NONLINEARITIES:
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "selu":
        return 3.0 / 4
    if nonlinearity == "leaky_relu":
        if param is None:
            slope = 0.01
        elif isinstance(param, (int, float)) and not isinstance(param, bool):
            slope = float(param)
        else:
            raise ValueError(f"calculate_gain: negative slope {param!r} is not a number")
        return math.sqrt(2.0 / (1 + slope**2))
    known = sorted((*_LINEAR_NONLINEARITIES, "tanh", "relu", "leaky_relu", "selu"))
    raise ValueError(f"calculate_gain: unknown nonlinearity {nonlinearity!r}; known: {known}")


def _fan(tensor: Tensor, mode: str) -> int:
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"mode must be 'fan_in' or 'fan_out', got {mode!r}")
    fan_in, fan_out = fan_in_and_fan_out(tensor)
    # A zero fan means an empty tensor: nothing to fill, so any positive divisor will do.
    return max(fan_in if mode == "fan_in" else fan_out, 1)


# --- filling ------------------------------------------------------------------------------
def _fill(tensor: Tensor, host_values: np.ndarray) -> Tensor:
    """Copy host float64 values into ``tensor``'s array in place (cast, moved to its device)."""
    if not isinstance(tensor, Tensor):
        raise TypeError(f"initialisers fill a Tensor or Parameter, got {type(tensor).__name__}")
    values = backend.to_device(host_values.astype(tensor.dtype, copy=False), tensor.device)
    tensor.data[...] = values
    return tensor


def _generator(generator: np.random.Generator | None) -> np.random.Generator:
    if generator is None:
        return _default_generator
    if not isinstance(generator, np.random.Generator):
        raise TypeError(
            f"generator must be a numpy.random.Generator or None, got {type(generator).__name__}"
        )
    return generator


def uniform_(
    tensor: Tensor, a: float = 0.0, b: float = 1.0, generator: np.random.Generator | None = None
) -> Tensor:
    """Fill with draws from the uniform distribution on ``[a, b)``."""
    if not a <= b:
        raise ValueError(f"uniform_: lower bound a={a} is above upper bound b={b}")
    return _fill(tensor, _generator(generator).uniform(a, b, size=tensor.shape))


def normal_(
    tensor: Tensor,
    mean: float = 0.0,
    std: float = 1.0,
    generator: np.random.Generator | None = None,
) -> Tensor:
    """Fill with draws from the normal distribution ``N(mean, std**2)``."""
    if std < 0:
        raise ValueError(f"normal_: std must be >= 0, got {std}")
    return _fill(tensor, _generator(generator).normal(mean, std, size=tensor.shape))


def constant_(tensor: Tensor, val: float) -> Tensor:
    """Fill with ``val``."""
    return _fill(tensor, np.full(tensor.shape, val, dtype=np.float64))


def zeros_(tensor: Tensor) -> Tensor:
    """Fill with zeros."""
    return constant_(tensor, 0.0)


def ones_(tensor: Tensor) -> Tensor:
    """Fill with ones."""
    return constant_(tensor, 1.0)


def xavier_uniform_(
    tensor: Tensor, gain: float = 1.0, generator: np.random.Generator | None = None
) -> Tensor:
    """Glorot uniform: ``U(-bound, bound)`` with ``bound = gain * sqrt(6 / (fan_in + fan_out))``."""
    fan_in, fan_out = fan_in_and_fan_out(tensor)
    bound = gain * math.sqrt(6.0 / max(fan_in + fan_out, 1))
    return uniform_(tensor, -bound, bound, generator)


def xavier_normal_(
    tensor: Tensor, gain: float = 1.0, generator: np.random.Generator | None = None
) -> Tensor:
    """Glorot normal: ``N(0, std**2)`` with ``std = gain * sqrt(2 / (fan_in + fan_out))``."""
    fan_in, fan_out = fan_in_and_fan_out(tensor)
    return normal_(tensor, 0.0, gain * math.sqrt(2.0 / max(fan_in + fan_out, 1)), generator)


def kaiming_uniform_(
    tensor: Tensor,
    a: float = 0.0,
    mode: str = "fan_in",
    nonlinearity: str = "leaky_relu",
    generator: np.random.Generator | None = None,
) -> Tensor:
    """He uniform: ``U(-bound, bound)`` with ``bound = gain * sqrt(3 / fan)``.

    Parameters
    ----------
    tensor : Tensor
        Weight in ``(out, in, *kernel)`` layout.
    a : float
        Negative slope of the following leaky ReLU (used when ``nonlinearity='leaky_relu'``).
    mode : {'fan_in', 'fan_out'}
        ``'fan_in'`` keeps the forward activations' variance, ``'fan_out'`` the gradients'.
    nonlinearity : str
        See :func:`calculate_gain`.
    generator : numpy.random.Generator, optional
    """
    std = calculate_gain(nonlinearity, a) / math.sqrt(_fan(tensor, mode))
    bound = math.sqrt(3.0) * std
    return uniform_(tensor, -bound, bound, generator)


def kaiming_normal_(
    tensor: Tensor,
    a: float = 0.0,
    mode: str = "fan_in",
    nonlinearity: str = "leaky_relu",
    generator: np.random.Generator | None = None,
) -> Tensor:
    """He normal: ``N(0, std**2)`` with ``std = gain / sqrt(fan)``; arguments as
    :func:`kaiming_uniform_`."""
    std = calculate_gain(nonlinearity, a) / math.sqrt(_fan(tensor, mode))
    return normal_(tensor, 0.0, std, generator)
