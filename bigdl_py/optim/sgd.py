"""``SGD``: stochastic gradient descent with momentum, Nesterov momentum and weight decay."""

from __future__ import annotations

from typing import Any

from bigdl_py.kernels import optimizers as fused
from bigdl_py.optim.optim_method import OptimMethod, check_hyper_parameter
from bigdl_py.optim.schedules import Schedule


class SGD(OptimMethod):
    r"""Stochastic gradient descent, as in BigDL's SGD and PyTorch's ``torch.optim.SGD``.

    With ``g`` the gradient, ``w`` the weight, ``b`` the momentum buffer and ``t`` the step
    count (1 on the first step)::

        g <- g + weight_decay * w
        if momentum != 0:
            b <- g                                    if t == 1
            b <- momentum * b + (1 - dampening) * g   otherwise
            g <- g + momentum * b   if nesterov   else   b
        w <- w - lr * g

    Parameters
    ----------
    lr : float
        Learning rate, >= 0.
    momentum : float
        Momentum factor, >= 0.
    dampening : float
        Dampening of the momentum, in [0, 1].
    nesterov : bool
        Nesterov momentum; needs ``momentum > 0`` and ``dampening == 0``.
    weight_decay : float
        L2 penalty added to the gradient, >= 0.
    schedule : Schedule, optional
        Learning-rate schedule (default: constant).
    """

    hyper_parameter_names = ("lr", "momentum", "dampening", "nesterov", "weight_decay")

    def __init__(
        self,
        lr: float = 1e-3,
        momentum: float = 0.0,
        dampening: float = 0.0,
        nesterov: bool = False,
        weight_decay: float = 0.0,
        schedule: Schedule | None = None,
    ):
        super().__init__(lr, schedule)
        self.momentum = check_hyper_parameter("SGD", "momentum", momentum, 0)
        self.dampening = check_hyper_parameter("SGD", "dampening", dampening, 0, 1)
        self.weight_decay = check_hyper_parameter("SGD", "weight_decay", weight_decay, 0)
        self.nesterov = bool(nesterov)
        if self.nesterov and (self.momentum <= 0 or self.dampening != 0):
            raise ValueError(
                f"SGD: nesterov=True needs momentum > 0 and dampening == 0, got "
                f"momentum={momentum!r}, dampening={dampening!r}"
            )

    def _state_names(self) -> tuple[str, ...]:
        return ("momentum_buffer",) if self.momentum != 0 else ()

    _fused_kernel = fused.SGD

    def _fused_arguments(self, weight: Any, learning_rate: Any) -> tuple:
        buffer = self._state.get("momentum_buffer", weight)  # read only with momentum
        return (
            buffer,
            learning_rate,
            self.momentum,
            1.0 - self.dampening,
            self.weight_decay,
            int(self.nesterov),
        )

    def _update(self, weight: Any, gradient: Any, learning_rate: float) -> None:
        if self.weight_decay != 0:
            gradient = gradient + self.weight_decay * weight
        if self.momentum != 0:
            buffer = self._state["momentum_buffer"]
            if self.step_count == 1:
                buffer[...] = gradient  # the first step starts the buffer undamped
            else:
                buffer *= self.momentum
                if self.dampening == 0:
                    # (1 - 0) * g is g exactly: skipping the product saves a temporary and a
                    # pass over the vector (MLP's 670k floats: 286 -> 244 us a step, CPU).
                    buffer += gradient
                else:
                    buffer += (1.0 - self.dampening) * gradient
            gradient = gradient + self.momentum * buffer if self.nesterov else buffer
        weight -= learning_rate * gradient
