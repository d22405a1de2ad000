"""``AdamW``: Adam with decoupled weight decay."""

from __future__ import annotations

from typing import Any

from bigdl_py.optim.adam import Adam
from bigdl_py.optim.schedules import Schedule


class AdamW(Adam):
    r"""AdamW (Loshchilov & Hutter), as in PyTorch's ``torch.optim.AdamW``.

    The weight decays directly instead of through the gradient, then Adam's update follows
    (see :class:`Adam`; ``t`` is the step count)::

        w <- w * (1 - lr * weight_decay)
        m <- beta1 * m + (1 - beta1) * g
        v <- beta2 * v + (1 - beta2) * g * g
        v_hat <- max(v_max, v) if amsgrad else v
        w <- w - lr / (1 - beta1**t) * m / (sqrt(v_hat) / sqrt(1 - beta2**t) + eps)

    Parameters are those of :class:`Adam`; ``weight_decay`` defaults to 0.01.
    """

    def __init__(
        self,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        amsgrad: bool = False,
        schedule: Schedule | None = None,
    ):
        super().__init__(lr, betas, eps, weight_decay, amsgrad, schedule)

    _decoupled_decay = True

    def _apply_weight_decay(self, weight: Any, gradient: Any, learning_rate: float) -> Any:
        """Decoupled decay: shrink the weight, leave the gradient alone."""
        if self.weight_decay != 0:
            weight *= 1.0 - learning_rate * self.weight_decay
        return gradient
