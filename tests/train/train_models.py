"""Small data and models for the training-loop tests (each trains in well under a second).

A plain module (not conftest) so test files and subprocess workers import it by name."""

from __future__ import annotations

import numpy as np

from bigdl_py import nn


def make_blobs(samples: int = 240, features: int = 8, classes: int = 3, seed: int = 0):
    """Separable Gaussian blobs: ``(features float32, labels int64)``."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=3.0, size=(classes, features))
    labels = rng.integers(0, classes, size=samples)
    features_array = centres[labels] + rng.normal(size=(samples, features))
    return features_array.astype(np.float32), labels.astype(np.int64)


def make_classifier(seed: int = 0, features: int = 8, classes: int = 3, dropout: float = 0.0):
    """Linear-Tanh-(Dropout)-Linear-LogSoftmax with weights from ``seed``."""
    with nn.init.seeded(seed):
        layers = [nn.Linear(features, 16), nn.Tanh()]
        if dropout:
            layers.append(nn.Dropout(dropout))
        layers += [nn.Linear(16, classes), nn.LogSoftmax()]
        return nn.Sequential(*layers)
