"""LocalOptimizer(micro_batches=, seed=): gradient accumulation with per-micro-batch
BatchNorm (GPipe's arithmetic, PyTorch as the oracle) and dropout streams keyed by
(seed, iteration, micro-batch, layer)."""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py import nn
from bigdl_py.autograd import Tensor, ops
from bigdl_py.data import ArrayDataset
from bigdl_py.optim import SGD
from bigdl_py.train import LocalOptimizer, MaxIteration
from bigdl_py.train.rng import keyed_random_streams, random_stream

BATCH, MICRO_BATCHES, ITERATIONS = 16, 4, 3


def data(seed=0):
    generator = np.random.default_rng(seed)
    features = generator.normal(size=(48, 6))
    return features, generator.integers(0, 3, 48)


def batch_norm_model():
    with nn.init.seeded(3):
        return nn.Sequential(
            nn.Linear(6, 8), nn.BatchNorm1d(8), nn.Tanh(), nn.Linear(8, 3), nn.LogSoftmax()
        ).double()


def train(model, features, labels, **options):
    optimizer = LocalOptimizer(
        model,
        ArrayDataset(features, labels, shuffle=False),
        nn.NLLLoss(),
        SGD(lr=0.1),
        batch_size=BATCH,
        end_trigger=MaxIteration(ITERATIONS),
        progress=False,
        **options,
    )
    return optimizer.optimize()


def test_micro_batches_normalise_each_micro_batch_as_pytorch_does(torch):
    """Each micro-batch runs forward with its own batch statistics and updates the running
    statistics in turn; the gradients of ``(size / batch) x mean loss`` add up."""
    features, labels = data()
    trained = train(batch_norm_model(), features, labels, micro_batches=MICRO_BATCHES)

    reference = torch.nn.Sequential(
        torch.nn.Linear(6, 8),
        torch.nn.BatchNorm1d(8),
        torch.nn.Tanh(),
        torch.nn.Linear(8, 3),
        torch.nn.LogSoftmax(dim=1),
    ).double()
    start = batch_norm_model().state_dict()
    reference.load_state_dict({k: torch.tensor(np.asarray(v)) for k, v in start.items()})
    sgd = torch.optim.SGD(reference.parameters(), lr=0.1)
    for iteration in range(ITERATIONS):
        sgd.zero_grad()
        batch = slice(iteration * BATCH, (iteration + 1) * BATCH)
        x, y = torch.tensor(features[batch]), torch.tensor(labels[batch])
        for piece in np.array_split(np.arange(BATCH), MICRO_BATCHES):
            loss = torch.nn.functional.nll_loss(reference(x[piece]), y[piece])
            (loss * (len(piece) / BATCH)).backward()
        sgd.step()
    expected = reference.state_dict()
    for name, value in trained.state_dict().items():
        np.testing.assert_allclose(
            np.asarray(value), expected[name].numpy(), rtol=1e-10, atol=1e-12, err_msg=name
        )


def test_without_batch_statistics_micro_batches_change_nothing():
    features, labels = data(1)

    def model():
        with nn.init.seeded(4):
            return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3), nn.LogSoftmax())

    whole = train(model().double(), features, labels)
    pieces = train(model().double(), features, labels, micro_batches=MICRO_BATCHES)
    for (name, a), b in zip(whole.state_dict().items(), pieces.state_dict().values(), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, err_msg=name)


def dropout_model(layer_seed=None):
    with nn.init.seeded(5):
        return nn.Sequential(
            nn.Linear(6, 16), nn.Dropout(0.5, seed=layer_seed), nn.Linear(16, 3), nn.LogSoftmax()
        )


def test_keyed_streams_give_each_layer_its_own_mask_and_put_the_generators_back():
    model = dropout_model(layer_seed=9)
    layer = model[1]
    own = layer.generator
    x = np.ones((4, 16), dtype=np.float32)
    key = (7, 2, 1)
    with keyed_random_streams(enumerate(model.modules()), key):
        keyed = layer(Tensor(x)).numpy()
    expected = ops.dropout(Tensor(x), 0.5, rng=random_stream(key, 2)).numpy()
    np.testing.assert_array_equal(keyed, expected)
    assert layer.generator is own  # the layer's own stream is back
    unseeded = dropout_model()
    with keyed_random_streams(enumerate(unseeded.modules()), key):
        np.testing.assert_array_equal(unseeded[1](Tensor(x)).numpy(), expected)
    assert unseeded[1].generator is None


def test_a_seed_keys_the_masks_so_runs_repeat_and_seeds_differ():
    features, labels = data(2)
    features = features.astype(np.float32)
    first = train(dropout_model(), features, labels, micro_batches=2, seed=11)
    ops.manual_seed(123)  # the shared stream plays no part
    again = train(dropout_model(), features, labels, micro_batches=2, seed=11)
    other = train(dropout_model(), features, labels, micro_batches=2, seed=12)
    weights = [
        np.concatenate([p.numpy().ravel() for p in m.parameters()]) for m in (first, again, other)
    ]
    np.testing.assert_array_equal(weights[0], weights[1])
    assert np.abs(weights[0] - weights[2]).max() > 1e-4


@pytest.mark.parametrize(
    "options, message",
    [
        ({"micro_batches": 0}, "micro_batches"),
        ({"seed": -1}, "seed"),
        ({"micro_batches": 2.0}, "micro_batches"),
    ],
)
def test_bad_micro_batch_settings_are_named(options, message):
    features, labels = data()
    with pytest.raises(ValueError, match=message):
        LocalOptimizer(
            batch_norm_model(), (features, labels), nn.NLLLoss(), SGD(lr=0.1), 8, **options
        )
