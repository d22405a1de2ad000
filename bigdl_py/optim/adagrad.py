"""``Adagrad``: per-element learning rates from the sum of squared gradients."""

from __future__ import annotations

from typing import Any

from bigdl_py import backend
from bigdl_py.kernels import optimizers as fused
from bigdl_py.optim.optim_method import OptimMethod, check_hyper_parameter
from bigdl_py.optim.schedules import Schedule


class Adagrad(OptimMethod):
    r"""Adagrad (Duchi et al.), as in PyTorch's ``torch.optim.Adagrad`` and BigDL's Adagrad.

    With ``s`` the running sum of squared gradients (starting at
    ``initial_accumulator_value``) and ``t`` the step count::

        g <- g + weight_decay * w
        s <- s + g * g
        w <- w - lr / (1 + (t - 1) * lr_decay) * g / (sqrt(s) + eps)

    Parameters
    ----------
    lr : float
        Learning rate, >= 0.
    lr_decay : float
        Inverse-time decay of the learning rate per step, >= 0.
    weight_decay : float
        L2 penalty added to the gradient, >= 0.
    initial_accumulator_value : float
        Starting value of ``s``, >= 0.
    eps : float
        Added to the denominator, >= 0.
    schedule : Schedule, optional
        Learning-rate schedule (default: constant), applied before ``lr_decay``.
    """

    hyper_parameter_names = ("lr", "lr_decay", "weight_decay", "initial_accumulator_value", "eps")

    def __init__(
        self,
        lr: float = 1e-2,
        lr_decay: float = 0.0,
        weight_decay: float = 0.0,
        initial_accumulator_value: float = 0.0,
        eps: float = 1e-10,
        schedule: Schedule | None = None,
    ):
        super().__init__(lr, schedule)
        self.lr_decay = check_hyper_parameter("Adagrad", "lr_decay", lr_decay, 0)
        self.weight_decay = check_hyper_parameter("Adagrad", "weight_decay", weight_decay, 0)
        self.initial_accumulator_value = check_hyper_parameter(
            "Adagrad", "initial_accumulator_value", initial_accumulator_value, 0
        )
        self.eps = check_hyper_parameter("Adagrad", "eps", eps, 0)

    def _state_names(self) -> tuple[str, ...]:
        return ("sum",)

    _fused_kernel = fused.ADAGRAD

    def _fused_arguments(self, weight: Any, learning_rate: Any) -> tuple:
        return (self._state["sum"], learning_rate, self.lr_decay, self.eps, self.weight_decay)

    def _initial_state(self, weight: Any) -> dict[str, Any]:
        xp = backend.array_module(weight)
        return {"sum": xp.full_like(weight, self.initial_accumulator_value)}

    def _update(self, weight: Any, gradient: Any, learning_rate: float) -> None:
        xp = backend.array_module(weight)
        if self.weight_decay != 0:
            gradient = gradient + self.weight_decay * weight
        square_sum = self._state["sum"]
        scratch = xp.empty_like(weight)
        square_sum += xp.multiply(gradient, gradient, out=scratch)
        denominator = xp.sqrt(square_sum, out=scratch)
        denominator += self.eps
        update = xp.divide(gradient, denominator, out=scratch)
        update *= learning_rate / (1.0 + (self.step_count - 1) * self.lr_decay)
        weight -= update
