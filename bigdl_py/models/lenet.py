"""LeNet-5 as BigDL's examples define it for 28x28 grey images."""

from __future__ import annotations

from bigdl_py import nn


def lenet5(classes: int = 10) -> nn.Sequential:
    """Conv(1->6, 5)-Tanh-MaxPool(2)-Conv(6->12, 5)-Tanh-MaxPool(2)-Linear(192->100)-Tanh-
    Linear(100->classes)-LogSoftmax; pair it with ``nn.NLLLoss()``."""
    return nn.Sequential(
        nn.Conv2d(1, 6, 5),
        nn.Tanh(),
        nn.MaxPool2d(2),
        nn.Conv2d(6, 12, 5),
        nn.Tanh(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(12 * 4 * 4, 100),
        nn.Tanh(),
        nn.Linear(100, classes),
        nn.LogSoftmax(),
    )
