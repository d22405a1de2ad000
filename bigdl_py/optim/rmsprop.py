"""``RMSprop``: divide by a running root mean square of the gradient."""

from __future__ import annotations

from typing import Any

from bigdl_py import backend
from bigdl_py.kernels import optimizers as fused
from bigdl_py.optim.optim_method import OptimMethod, check_hyper_parameter
from bigdl_py.optim.schedules import Schedule


class RMSprop(OptimMethod):
    r"""RMSprop (Hinton), as in PyTorch's ``torch.optim.RMSprop`` and BigDL's RMSprop.

    With ``v`` the running average of squared gradients, ``m`` that of gradients (centered
    only) and ``b`` the momentum buffer::

        g <- g + weight_decay * w
        v <- alpha * v + (1 - alpha) * g * g
        m <- alpha * m + (1 - alpha) * g                    (centered)
        r <- sqrt(v - m * m) + eps  if centered  else  sqrt(v) + eps
        if momentum > 0:  b <- momentum * b + g / r;  w <- w - lr * b
        else:             w <- w - lr * g / r

    Parameters
    ----------
    lr : float
        Learning rate, >= 0.
    alpha : float
        Decay of the running averages, in [0, 1].
    eps : float
        Added to the denominator, >= 0.
    weight_decay : float
        L2 penalty added to the gradient, >= 0.
    momentum : float
        Momentum factor, >= 0.
    centered : bool
        Normalise by an estimate of the gradient's variance instead of its second moment.
    schedule : Schedule, optional
        Learning-rate schedule (default: constant).
    """

    hyper_parameter_names = ("lr", "alpha", "eps", "weight_decay", "momentum", "centered")

    def __init__(
        self,
        lr: float = 1e-2,
        alpha: float = 0.99,
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        momentum: float = 0.0,
        centered: bool = False,
        schedule: Schedule | None = None,
    ):
        super().__init__(lr, schedule)
        self.alpha = check_hyper_parameter("RMSprop", "alpha", alpha, 0, 1)
        self.eps = check_hyper_parameter("RMSprop", "eps", eps, 0)
        self.weight_decay = check_hyper_parameter("RMSprop", "weight_decay", weight_decay, 0)
        self.momentum = check_hyper_parameter("RMSprop", "momentum", momentum, 0)
        self.centered = bool(centered)

    def _state_names(self) -> tuple[str, ...]:
        names = ("square_avg",)
        if self.momentum > 0:
            names += ("momentum_buffer",)
        if self.centered:
            names += ("grad_avg",)
        return names

    _fused_kernel = fused.RMSPROP

    def _fused_arguments(self, weight: Any, learning_rate: Any) -> tuple:
        state = self._state
        return (
            state["square_avg"],
            state.get("grad_avg", weight),  # read only when centered
            state.get("momentum_buffer", weight),  # read only with momentum
            learning_rate,
            self.alpha,
            1.0 - self.alpha,
            self.eps,
            self.weight_decay,
            self.momentum,
            int(self.centered),
        )

    def _update(self, weight: Any, gradient: Any, learning_rate: float) -> None:
        xp = backend.array_module(weight)
        alpha = self.alpha
        if self.weight_decay != 0:
            gradient = gradient + self.weight_decay * weight
        square_avg = self._state["square_avg"]
        scratch = xp.empty_like(weight)  # the one temporary of the step, reused throughout
        square_avg *= alpha
        xp.multiply(gradient, gradient, out=scratch)
        scratch *= 1.0 - alpha
        square_avg += scratch
        if self.centered:
            grad_avg = self._state["grad_avg"]
            grad_avg *= alpha
            grad_avg += xp.multiply(gradient, 1.0 - alpha, out=scratch)
            xp.multiply(grad_avg, grad_avg, out=scratch)
            xp.subtract(square_avg, scratch, out=scratch)
            denominator = xp.sqrt(scratch, out=scratch)
        else:
            denominator = xp.sqrt(square_avg, out=scratch)
        denominator += self.eps
        step = xp.divide(gradient, denominator, out=scratch)
        if self.momentum > 0:
            buffer = self._state["momentum_buffer"]
            buffer *= self.momentum
            buffer += step
            step = xp.multiply(buffer, learning_rate, out=scratch)
        else:
            step *= learning_rate
        weight -= step
