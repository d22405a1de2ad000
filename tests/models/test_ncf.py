"""Neural collaborative filtering: shapes, id checks, training, save/load."""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py import nn
from bigdl_py.autograd import Tensor
from bigdl_py.models import ncf
from bigdl_py.models.ncf import NCF


@pytest.fixture
def pairs(rng):
    return np.stack([rng.integers(0, 7, size=32), rng.integers(0, 11, size=32)], axis=1)


@pytest.mark.parametrize("gmf", [True, False])
def test_one_score_per_pair_from_integer_or_float_ids(pairs, gmf):
    model = ncf(7, 11, embedding_dim=4, hidden=(8, 4), gmf=gmf)
    scores = model(pairs).numpy()
    assert scores.shape == (32,) and scores.dtype == np.float32
    np.testing.assert_array_equal(model(Tensor(pairs.astype(np.float32))).numpy(), scores)
    assert ("user_gmf.weight" in model.state_dict()) == gmf


def test_bad_ids_are_refused_naming_the_problem():
    model = ncf(7, 11, embedding_dim=4, hidden=(8, 4))
    with pytest.raises(ValueError, match=r"\(N, 2\)"):
        model(np.zeros((3, 3), np.int64))
    with pytest.raises(
        ValueError, match=r"item ids must lie in \[0, 11\), got values in \[0, 11\]"
    ):
        model(np.array([[0, 11], [1, 0]]))
    with pytest.raises(ValueError, match="user ids must lie"):
        model(np.array([[-1, 0]]))
    with pytest.raises(ValueError, match="whole numbers"):
        model(np.array([[0.5, 1.0]], np.float32))
    with pytest.raises(ValueError, match="even first"):
        NCF(7, 11, hidden=(9, 4))


def test_a_few_sgd_steps_lower_the_rating_loss(pairs, rng, sgd_losses):
    ratings = rng.uniform(1, 5, size=32).astype(np.float32)
    model = ncf(7, 11, embedding_dim=4, hidden=(8, 4))
    loss = nn.MSELoss()
    losses = sgd_losses(model, lambda m: loss(m(pairs), ratings), steps=5, lr=0.05)
    assert losses[-1] < losses[0]


def test_save_load_round_trip(tmp_path, pairs):
    model = ncf(7, 11, embedding_dim=4, hidden=(8, 4), dropout=0.1).eval()
    path = tmp_path / "ncf.bigdl"
    nn.save(model, path)
    loaded = nn.load(path)
    assert isinstance(loaded, NCF)
    np.testing.assert_array_equal(loaded(pairs).numpy(), model(pairs).numpy())
