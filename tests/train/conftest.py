"""Fixtures for the training-loop tests; the builders live in train_models.py."""

from __future__ import annotations

import pytest
from train_models import make_blobs, make_classifier

from bigdl_py.data import ArrayDataset


@pytest.fixture
def blobs():
    return make_blobs()


@pytest.fixture
def blob_dataset(blobs):
    features, labels = blobs
    return ArrayDataset(features, labels, batch_size=32, seed=7)


@pytest.fixture
def classifier():
    return make_classifier()
