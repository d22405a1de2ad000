"""``Adamax``: Adam with the infinity norm in place of the second moment."""

from __future__ import annotations

from typing import Any

from bigdl_py import backend
from bigdl_py.kernels import optimizers as fused
from bigdl_py.optim.adam import check_betas
from bigdl_py.optim.optim_method import OptimMethod, check_hyper_parameter
from bigdl_py.optim.schedules import Schedule


class Adamax(OptimMethod):
    r"""Adamax (Kingma & Ba, section 7), as in PyTorch's ``torch.optim.Adamax``.

    With ``m`` the first moment, ``u`` the exponentially weighted infinity norm and ``t`` the
    step count::

        g <- g + weight_decay * w
        m <- beta1 * m + (1 - beta1) * g
        u <- max(beta2 * u, |g| + eps)
        w <- w - lr / (1 - beta1**t) * m / u

    Parameters
    ----------
    lr : float
        Learning rate, >= 0.
    betas : (float, float)
        Decay rates, each in [0, 1).
    eps : float
        Floor added to ``|g|``, >= 0.
    weight_decay : float
        L2 penalty added to the gradient, >= 0.
    schedule : Schedule, optional
        Learning-rate schedule (default: constant).
    """

    hyper_parameter_names = ("lr", "betas", "eps", "weight_decay")

    def __init__(
        self,
        lr: float = 2e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        schedule: Schedule | None = None,
    ):
        super().__init__(lr, schedule)
        self.betas = check_betas("Adamax", betas)
        self.eps = check_hyper_parameter("Adamax", "eps", eps, 0)
        self.weight_decay = check_hyper_parameter("Adamax", "weight_decay", weight_decay, 0)

    def _state_names(self) -> tuple[str, ...]:
        return ("exp_avg", "exp_inf")

    _fused_kernel = fused.ADAMAX

    def _fused_arguments(self, weight: Any, learning_rate: Any) -> tuple:
        beta1, beta2 = self.betas
        state = self._state
        return (
            state["exp_avg"],
            state["exp_inf"],
            learning_rate,
            beta1,
            1.0 - beta1,
            beta2,
            self.eps,
            self.weight_decay,
        )

    def _update(self, weight: Any, gradient: Any, learning_rate: float) -> None:
        xp = backend.array_module(weight)
        beta1, beta2 = self.betas
        if self.weight_decay != 0:
            gradient = gradient + self.weight_decay * weight
        exp_avg, exp_inf = self._state["exp_avg"], self._state["exp_inf"]
        scratch = xp.empty_like(weight)
        exp_avg *= beta1
        exp_avg += xp.multiply(gradient, 1.0 - beta1, out=scratch)
        exp_inf *= beta2
        floor = xp.abs(gradient, out=scratch)
        floor += self.eps
        xp.maximum(exp_inf, floor, out=exp_inf)
        update = xp.divide(exp_avg, exp_inf, out=scratch)
        update *= learning_rate / (1.0 - beta1**self.step_count)
        weight -= update
