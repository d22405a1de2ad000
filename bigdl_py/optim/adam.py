"""``Adam``: adaptive moment estimation (with optional AMSGrad)."""

from __future__ import annotations

import math
from typing import Any

from bigdl_py import backend
from bigdl_py.kernels import optimizers as fused
from bigdl_py.optim.optim_method import OptimMethod, check_hyper_parameter
from bigdl_py.optim.schedules import Schedule


def check_betas(owner: str, betas: tuple[float, float]) -> tuple[float, float]:
    """Both coefficients in [0, 1), as a tuple of floats."""
    if len(betas) != 2:
        raise ValueError(f"{owner}: betas must be a pair (beta1, beta2), got {betas!r}")
    return (
        check_hyper_parameter(owner, "beta1", betas[0], 0, 1, high_open=True),
        check_hyper_parameter(owner, "beta2", betas[1], 0, 1, high_open=True),
    )


class Adam(OptimMethod):
    r"""Adam (Kingma & Ba), as in PyTorch's ``torch.optim.Adam``.

    With ``g`` the gradient, ``m``/``v`` the first/second moment buffers and ``t`` the step
    count (1 on the first step)::

        g <- g + weight_decay * w
        m <- beta1 * m + (1 - beta1) * g
        v <- beta2 * v + (1 - beta2) * g * g
        v_max <- max(v_max, v);  v_hat <- v_max if amsgrad else v
        w <- w - lr / (1 - beta1**t) * m / (sqrt(v_hat) / sqrt(1 - beta2**t) + eps)

    Parameters
    ----------
    lr : float
        Learning rate, >= 0.
    betas : (float, float)
        Decay rates of the moment estimates, each in [0, 1).
    eps : float
        Added to the denominator for stability, >= 0.
    weight_decay : float
        L2 penalty added to the gradient, >= 0 (for decoupled decay use :class:`AdamW`).
    amsgrad : bool
        Use the running maximum of ``v`` (AMSGrad).
    schedule : Schedule, optional
        Learning-rate schedule (default: constant).
    """

    hyper_parameter_names = ("lr", "betas", "eps", "weight_decay", "amsgrad")

    def __init__(
        self,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        schedule: Schedule | None = None,
    ):
        super().__init__(lr, schedule)
        owner = type(self).__name__
        self.betas = check_betas(owner, betas)
        self.eps = check_hyper_parameter(owner, "eps", eps, 0)
        self.weight_decay = check_hyper_parameter(owner, "weight_decay", weight_decay, 0)
        self.amsgrad = bool(amsgrad)

    def _state_names(self) -> tuple[str, ...]:
        names = ("exp_avg", "exp_avg_sq")
        return names + ("max_exp_avg_sq",) if self.amsgrad else names

    _fused_kernel = fused.ADAM
    #: AdamW's decay shrinks the weight instead of joining the gradient.
    _decoupled_decay = False

    def _fused_arguments(self, weight: Any, learning_rate: Any) -> tuple:
        beta1, beta2 = self.betas
        state = self._state
        return (
            state["exp_avg"],
            state["exp_avg_sq"],
            state.get("max_exp_avg_sq", weight),  # read only with amsgrad
            learning_rate,
            beta1,
            beta2,
            1.0 - beta1,
            1.0 - beta2,
            self.eps,
            self.weight_decay,
            int(self._decoupled_decay),
            int(self.amsgrad),
        )

    def _apply_weight_decay(self, weight: Any, gradient: Any, learning_rate: float) -> Any:
        """Adam's coupled decay: the penalty's gradient joins the gradient."""
        if self.weight_decay != 0:
            return gradient + self.weight_decay * weight
        return gradient

    def _update(self, weight: Any, gradient: Any, learning_rate: float) -> None:
        xp = backend.array_module(weight)
        beta1, beta2 = self.betas
        gradient = self._apply_weight_decay(weight, gradient, learning_rate)
        exp_avg, exp_avg_sq = self._state["exp_avg"], self._state["exp_avg_sq"]
        scratch = xp.empty_like(weight)  # the one temporary of the step, reused throughout
        exp_avg *= beta1
        exp_avg += xp.multiply(gradient, 1.0 - beta1, out=scratch)
        exp_avg_sq *= beta2
        xp.multiply(gradient, gradient, out=scratch)
        scratch *= 1.0 - beta2
        exp_avg_sq += scratch
        second_moment = exp_avg_sq
        if self.amsgrad:
            second_moment = self._state["max_exp_avg_sq"]
            xp.maximum(second_moment, exp_avg_sq, out=second_moment)
        bias_correction1 = 1.0 - beta1**self.step_count
        bias_correction2 = 1.0 - beta2**self.step_count
        denominator = xp.sqrt(second_moment, out=scratch)
        denominator /= math.sqrt(bias_correction2)
        denominator += self.eps
        update = xp.divide(exp_avg, denominator, out=scratch)
        update *= learning_rate / bias_correction1
        weight -= update
