"""``Adadelta``: step sizes from running averages of squared gradients and squared updates."""

from __future__ import annotations

from typing import Any

from bigdl_py import backend
from bigdl_py.kernels import optimizers as fused
from bigdl_py.optim.optim_method import OptimMethod, check_hyper_parameter
from bigdl_py.optim.schedules import Schedule


class Adadelta(OptimMethod):
    r"""Adadelta (Zeiler), as in PyTorch's ``torch.optim.Adadelta`` and BigDL's Adadelta.

    With ``v`` the running average of squared gradients and ``a`` that of squared updates::

        g <- g + weight_decay * w
        v <- rho * v + (1 - rho) * g * g
        d <- sqrt(a + eps) / sqrt(v + eps) * g
        a <- rho * a + (1 - rho) * d * d
        w <- w - lr * d

    Parameters
    ----------
    lr : float
        Scale of the update, >= 0 (1.0 is Zeiler's original rule).
    rho : float
        Decay of the running averages, in [0, 1].
    eps : float
        Added inside both square roots, >= 0.
    weight_decay : float
        L2 penalty added to the gradient, >= 0.
    schedule : Schedule, optional
        Learning-rate schedule (default: constant).
    """

    hyper_parameter_names = ("lr", "rho", "eps", "weight_decay")

    def __init__(
        self,
        lr: float = 1.0,
        rho: float = 0.9,
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        schedule: Schedule | None = None,
    ):
        super().__init__(lr, schedule)
        self.rho = check_hyper_parameter("Adadelta", "rho", rho, 0, 1)
        self.eps = check_hyper_parameter("Adadelta", "eps", eps, 0)
        self.weight_decay = check_hyper_parameter("Adadelta", "weight_decay", weight_decay, 0)

    def _state_names(self) -> tuple[str, ...]:
        return ("square_avg", "acc_delta")

    _fused_kernel = fused.ADADELTA

    def _fused_arguments(self, weight: Any, learning_rate: Any) -> tuple:
        state = self._state
        return (
            state["square_avg"],
            state["acc_delta"],
            learning_rate,
            self.rho,
            1.0 - self.rho,
            self.eps,
            self.weight_decay,
        )

    def _update(self, weight: Any, gradient: Any, learning_rate: float) -> None:
        xp = backend.array_module(weight)
        rho = self.rho
        if self.weight_decay != 0:
            gradient = gradient + self.weight_decay * weight
        square_avg, acc_delta = self._state["square_avg"], self._state["acc_delta"]
        scratch = xp.empty_like(weight)
        square_avg *= rho
        xp.multiply(gradient, gradient, out=scratch)
        scratch *= 1.0 - rho
        square_avg += scratch
        delta = acc_delta + self.eps
        xp.sqrt(delta, out=delta)
        xp.add(square_avg, self.eps, out=scratch)
        delta /= xp.sqrt(scratch, out=scratch)
        delta *= gradient
        acc_delta *= rho
        xp.multiply(delta, delta, out=scratch)
        scratch *= 1.0 - rho
        acc_delta += scratch
        delta *= learning_rate
        weight -= delta
