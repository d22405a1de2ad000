"""The engine learns on real data: LeNet-5, one epoch of Fashion-MNIST, a plain Python loop.

No training-loop API: forward, NLL loss, backward and an SGD-with-momentum step on the flat
parameter vector, written out by hand, then the test-set accuracy. PyTorch's same model
reaches 84.7 % after this epoch on the project machine; the engine must reach 82 %.
"""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py import nn
from bigdl_py.autograd import Tensor, no_grad
from bigdl_py.data import fashion_mnist
from bigdl_py.models import lenet5
from bigdl_py.optim import SGD, FlatParameters

BATCH_SIZE = 128
EVALUATION_BATCH_SIZE = 1000


def accuracy(model: nn.Module, features: np.ndarray, labels: np.ndarray) -> float:
    model.eval()
    correct = 0
    with no_grad():
        for start in range(0, len(labels), EVALUATION_BATCH_SIZE):
            scores = model(Tensor(features[start : start + EVALUATION_BATCH_SIZE], _copy=False))
            predicted = scores.numpy().argmax(axis=1)
            correct += int((predicted == labels[start : start + EVALUATION_BATCH_SIZE]).sum())
    model.train()
    return correct / len(labels)


@pytest.mark.slow
def test_lenet5_reaches_82_percent_after_one_epoch_of_a_plain_loop(fashion_mnist_dir):
    train_features, train_labels = fashion_mnist("train", fashion_mnist_dir)
    test_features, test_labels = fashion_mnist("test", fashion_mnist_dir)
    with nn.init.seeded(0):
        model = lenet5()
    flat = FlatParameters(model)  # every parameter now views flat.weights / flat.gradients
    criterion = nn.NLLLoss()
    sgd = SGD(lr=0.05, momentum=0.9)

    order = np.random.default_rng(0).permutation(len(train_labels))
    losses = []
    for start in range(0, len(order), BATCH_SIZE):
        batch = order[start : start + BATCH_SIZE]
        flat.zero_grad()
        loss = criterion(model(Tensor(train_features[batch], _copy=False)), train_labels[batch])
        loss.backward()
        sgd.step(flat.weights, flat.gradients)
        losses.append(loss.item())

    assert np.all(np.isfinite(losses))
    # The loss falls: the last 50 batches average well below the first 50.
    assert np.mean(losses[-50:]) < 0.5 * np.mean(losses[:50])
    test_accuracy = accuracy(model, test_features, test_labels)
    assert test_accuracy >= 0.82, f"test accuracy {test_accuracy:.4f} after one epoch"
