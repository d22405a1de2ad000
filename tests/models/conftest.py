"""What the model-zoo tests share: a few plain SGD steps on one batch."""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py.autograd import Tensor


def _sgd_steps(model, compute_loss, steps: int = 3, lr: float = 0.05) -> list[float]:
    """The loss before each of ``steps`` SGD updates, then after the last one."""
    losses = []
    model.train()
    for _ in range(steps + 1):
        model.zero_grad()
        loss = compute_loss(model)
        losses.append(float(loss.item()))
        if len(losses) == steps + 1:
            break
        loss.backward()
        for parameter in model.parameters():
            if parameter.grad is not None:
                parameter.data -= lr * parameter.grad.data
    return losses


@pytest.fixture
def sgd_losses():
    """``sgd_losses(model, compute_loss, steps, lr)``: losses over a few SGD steps."""
    return _sgd_steps


@pytest.fixture
def as_tensor():
    return lambda array: Tensor(np.asarray(array))
