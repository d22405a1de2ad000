"""EmbeddingBag: finite differences, PyTorch parity (sum, mean, max; offsets; weights;
padding), save/load and errors.

The PyTorch check loads our ``state_dict`` into ``torch.nn.EmbeddingBag`` with
``strict=True`` and compares the output and the gradients of the weight and of the
per-sample weights in float64 to 1e-5 relative.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from memory_checks import traced_peak

from bigdl_py import backend, nn
from bigdl_py.autograd import Tensor, gradcheck

F64 = np.float64
VOCABULARY, WIDTH = 7, 3

FLAT = np.array([1, 2, 2, 4, 5, 1, 0, 3, 6])  # index 2 twice in the first bag
OFFSETS = np.array([0, 3, 3, 6])  # the second bag is empty
ROWS = np.array([[1, 2, 4], [6, 6, 0], [3, 2, 5]])
# Bags of very uneven sizes (1, 1, 36, 0, 2): the max must not pad every bag to the longest.
SKEWED = np.random.default_rng(5).integers(0, VOCABULARY, 40)
SKEWED_OFFSETS = np.array([0, 1, 2, 38, 38])

# (id, layer kwargs, indices, offsets, with per-sample weights)
CASES = [
    ("sum_2d", {"mode": "sum"}, ROWS, None, False),
    ("mean_2d", {"mode": "mean"}, ROWS, None, False),
    ("max_2d", {"mode": "max"}, ROWS, None, False),
    ("sum_offsets", {"mode": "sum"}, FLAT, OFFSETS, False),
    ("mean_offsets", {}, FLAT, OFFSETS, False),
    ("max_offsets", {"mode": "max"}, FLAT, OFFSETS, False),
    ("max_skewed_bags", {"mode": "max"}, SKEWED, SKEWED_OFFSETS, False),
    ("max_skewed_bags_padding", {"mode": "max", "padding_idx": 3}, SKEWED, SKEWED_OFFSETS, False),
    (
        "mean_include_last_offset",
        {"include_last_offset": True},
        FLAT,
        np.array([0, 2, 5, 9]),
        False,
    ),
    ("sum_padding", {"mode": "sum", "padding_idx": 2}, FLAT, OFFSETS, False),
    ("mean_padding", {"padding_idx": 2}, FLAT, OFFSETS, False),
    ("max_padding", {"mode": "max", "padding_idx": 6}, ROWS, None, False),
    (
        "mean_padding_empties_a_bag",
        {"padding_idx": 2},
        np.array([[1, 3, 1], [2, 2, 2], [4, 2, 0]]),
        None,
        False,
    ),
    (
        "max_padding_empties_a_bag",
        {"mode": "max", "padding_idx": 2},
        np.array([[1, 3, 1], [2, 2, 2], [4, 2, 0]]),
        None,
        False,
    ),
    ("sum_per_sample_weights", {"mode": "sum"}, FLAT, OFFSETS, True),
    ("sum_per_sample_weights_2d", {"mode": "sum"}, ROWS, None, True),
    (
        "sum_per_sample_weights_padding",
        {"mode": "sum", "padding_idx": 1},
        FLAT,
        OFFSETS,
        True,
    ),
]
CASE_PARAMS = [pytest.param(*case[1:], id=case[0]) for case in CASES]


def build(kwargs):
    with nn.init.seeded(0):
        return nn.EmbeddingBag(VOCABULARY, WIDTH, dtype=F64, **kwargs)


def sample_weights(indices):
    return np.random.default_rng(3).standard_normal(indices.shape)


@pytest.mark.parametrize("kwargs, indices, offsets, weighted", CASE_PARAMS)
def test_embedding_bag_gradients_match_finite_differences(kwargs, indices, offsets, weighted):
    layer = build(kwargs)
    checked = list(layer.parameters())
    per_sample = None
    if weighted:
        per_sample = Tensor(sample_weights(indices), requires_grad=True, dtype=F64)
        checked.append(per_sample)
    assert gradcheck(lambda *_: layer(indices, offsets, per_sample), checked)


@pytest.mark.parametrize("kwargs, indices, offsets, weighted", CASE_PARAMS)
def test_embedding_bag_matches_pytorch(torch, kwargs, indices, offsets, weighted):
    ours = build(kwargs)
    theirs = torch.nn.EmbeddingBag(VOCABULARY, WIDTH, **kwargs).double()
    theirs.load_state_dict(
        {name: torch.from_numpy(value) for name, value in ours.state_dict().items()}, strict=True
    )
    our_weights = their_weights = None
    if weighted:
        our_weights = Tensor(sample_weights(indices), requires_grad=True, dtype=F64)
        their_weights = torch.tensor(sample_weights(indices), requires_grad=True)
    their_offsets = None if offsets is None else torch.from_numpy(offsets)
    our_output = ours(indices, offsets, our_weights)
    their_output = theirs(torch.from_numpy(indices), their_offsets, their_weights)
    np.testing.assert_allclose(
        our_output.numpy(), their_output.detach().numpy(), rtol=1e-5, atol=1e-12
    )
    upstream = np.random.default_rng(1).standard_normal(our_output.shape)
    our_output.backward(upstream)
    their_output.backward(torch.from_numpy(upstream))
    np.testing.assert_allclose(
        ours.weight.grad.numpy(), theirs.weight.grad.numpy(), rtol=1e-5, atol=1e-12
    )
    if weighted:
        np.testing.assert_allclose(
            our_weights.grad.numpy(), their_weights.grad.numpy(), rtol=1e-5, atol=1e-12
        )


@pytest.mark.gpu
@pytest.mark.skipif(not backend.cuda_available(), reason="needs CuPy and a CUDA device")
@pytest.mark.parametrize("kwargs, indices, offsets, weighted", CASE_PARAMS)
def test_embedding_bag_on_cuda_matches_cpu(kwargs, indices, offsets, weighted):
    results = []
    for device in ("cpu", "cuda"):
        layer = build(kwargs).to(device)
        per_sample = None
        if weighted:
            per_sample = Tensor(
                sample_weights(indices), requires_grad=True, dtype=F64, device=device
            )
        output = layer(indices, offsets, per_sample)
        output.backward(np.random.default_rng(1).standard_normal(output.shape))
        results.append([output.numpy(), layer.weight.grad.numpy()])
        if weighted:
            results[-1].append(per_sample.grad.numpy())
    for on_cpu, on_cuda in zip(*results, strict=True):
        np.testing.assert_allclose(on_cuda, on_cpu, rtol=1e-10, atol=1e-12)


def test_max_of_one_long_bag_among_short_ones_needs_memory_of_the_indices_only():
    """Issue 27 item 14: padding every bag to the longest took bags x longest x D."""
    sizes = np.ones(400, dtype=np.int64)
    sizes[200] = 5_000
    indices = np.random.default_rng(0).integers(0, 50, int(sizes.sum()))
    offsets = np.r_[0, np.cumsum(sizes)[:-1]]
    layer = nn.EmbeddingBag(50, 8, mode="max")
    with traced_peak() as peak:
        output = layer(indices, offsets)
        output.sum().backward()
    # Padded to the longest bag: 400 x 5000 x 8 float32 = 64 MB; the indices' rows: 0.2 MB.
    assert peak["bytes"] < 8_000_000
    rows = layer.weight.numpy()[indices]
    np.testing.assert_array_equal(output.numpy()[200], rows[199:5199].max(axis=0))
    np.testing.assert_array_equal(output.numpy()[:199], rows[:199])


def test_a_nan_is_its_bags_maximum_and_takes_the_gradient():
    # As torch.max and np.max (and this layer before), not as PyTorch's EmbeddingBag, whose
    # max keeps a NaN only when it comes first in its bag: order should not decide that.
    layer = nn.EmbeddingBag(4, 2, mode="max", dtype=F64)
    layer.weight.data[...] = [[0.0, 1.0], [np.nan, 5.0], [2.0, 9.0], [3.0, 3.0]]
    output = layer(np.array([[0, 1, 2], [3, 0, 0]]))
    np.testing.assert_array_equal(output.numpy(), [[np.nan, 9.0], [3.0, 3.0]])
    output.backward(np.ones((2, 2)))
    np.testing.assert_array_equal(
        layer.weight.grad.numpy(), [[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]
    )


def test_bags_equal_embedding_lookups_reduced():
    """A bag's sum is the sum of its Embedding rows; an empty bag is zeros."""
    with nn.init.seeded(0):
        bag = nn.EmbeddingBag(VOCABULARY, WIDTH, mode="sum")
    lookup = nn.Embedding(VOCABULARY, WIDTH)
    lookup.load_state_dict(bag.state_dict())
    output = bag(Tensor(FLAT), Tensor(OFFSETS)).numpy()
    ends = list(OFFSETS[1:]) + [len(FLAT)]
    for bag_index, (start, end) in enumerate(zip(OFFSETS, ends, strict=True)):
        expected = lookup(FLAT[start:end]).numpy().sum(axis=0) if end > start else np.zeros(WIDTH)
        np.testing.assert_allclose(output[bag_index], expected, rtol=1e-6)


def test_padding_row_starts_at_zero_and_float32_stays_float32():
    layer = nn.EmbeddingBag(VOCABULARY, WIDTH, padding_idx=-1)
    assert layer.padding_idx == VOCABULARY - 1
    assert not layer.weight.numpy()[-1].any()
    output = layer(ROWS)
    output.sum().backward()
    assert output.dtype == layer.weight.grad.dtype == np.float32
    assert output.shape == (3, WIDTH)


def test_save_load_round_trip(tmp_path):
    layer = nn.EmbeddingBag(VOCABULARY, WIDTH, mode="max", include_last_offset=True, padding_idx=0)
    path = tmp_path / "bag.bigdl"
    nn.save(layer, path)
    loaded = nn.load(path)
    assert (loaded.mode, loaded.include_last_offset, loaded.padding_idx) == ("max", True, 0)
    offsets = np.array([0, 4, 9])
    np.testing.assert_array_equal(loaded(FLAT, offsets).numpy(), layer(FLAT, offsets).numpy())


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda: nn.EmbeddingBag(5, 2, mode="median"), ValueError, "mode must be one of"),
        (lambda: nn.EmbeddingBag(5, 2, padding_idx=5), ValueError, "padding_idx 5 is outside"),
        (
            lambda: nn.EmbeddingBag(5, 2)(np.zeros((2, 3), int), np.array([0, 3])),
            ValueError,
            r"EmbeddingBag\(5, 2, mode='mean'\): offsets must be None with 2-d indices",
        ),
        (lambda: nn.EmbeddingBag(5, 2)(np.zeros(4, int)), ValueError, "need offsets"),
        (
            lambda: nn.EmbeddingBag(5, 2)(np.zeros((2, 2, 2), int)),
            ValueError,
            r"indices must be \(B, L\), or \(M,\) with offsets, got shape \(2, 2, 2\)",
        ),
        (lambda: nn.EmbeddingBag(5, 2)(np.zeros((2, 3))), TypeError, "indices must be integers"),
        (
            lambda: nn.EmbeddingBag(5, 2)(np.array([0, 5]), np.array([0])),
            IndexError,
            "indices must be in \\[0, 4\\] .* max 5",
        ),
        (
            lambda: nn.EmbeddingBag(5, 2)(np.arange(4), np.array([1, 2])),
            ValueError,
            r"offsets must start at 0, never decrease .* got \[1, 2\]",
        ),
        (
            lambda: nn.EmbeddingBag(5, 2)(np.arange(4), np.array([0, 3, 2])),
            ValueError,
            "never decrease",
        ),
        (
            lambda: nn.EmbeddingBag(5, 2)(np.arange(4), np.array([0, 5])),
            ValueError,
            "stay within the 4 indices",
        ),
        (
            lambda: nn.EmbeddingBag(5, 2, include_last_offset=True)(np.arange(4), np.array([0, 3])),
            ValueError,
            "the last offset must equal the number of indices, 4, got 3",
        ),
        (
            lambda: nn.EmbeddingBag(5, 2)(np.arange(4), np.array([0]), np.ones(4)),
            ValueError,
            "per_sample_weights work only with mode='sum', not mode='mean'",
        ),
        (
            lambda: nn.EmbeddingBag(5, 2, mode="sum")(np.arange(4), np.array([0]), np.ones(3)),
            ValueError,
            r"per_sample_weights must have the shape of indices \(4,\), got \(3,\)",
        ),
    ],
    ids=[
        "mode",
        "padding_idx",
        "offsets_with_2d",
        "missing_offsets",
        "rank",
        "float_indices",
        "index_range",
        "offsets_start",
        "offsets_order",
        "offsets_end",
        "last_offset",
        "weights_mode",
        "weights_shape",
    ],
)
def test_bad_settings_and_inputs_are_refused_naming_the_problem(call, error, message):
    with pytest.raises(error, match=message):
        call()


@pytest.mark.parametrize("kwargs, indices, offsets, weighted", CASE_PARAMS)
def test_embedding_bag_on_a_device_reads_nothing_back_and_matches_cpu(
    kwargs, indices, offsets, weighted
):
    """On the strict device (a GPU stand-in that refuses reads inside a step), with the ids
    and offsets already on the device as a training step has them."""
    from bigdl_py import device_waits

    results = []
    for device in ("cpu", "strict"):
        layer = build(kwargs).to(device)
        per_sample = None
        if weighted:
            per_sample = Tensor(
                sample_weights(indices), requires_grad=True, dtype=F64, device=device
            )
        ids = Tensor(indices, device=device)
        starts = None if offsets is None else Tensor(offsets, device=device)
        with device_waits.no_device_waits() if device == "strict" else contextlib.nullcontext():
            output = layer(ids, starts, per_sample)
            upstream = np.random.default_rng(1).standard_normal(output.shape)
            output.backward(Tensor(upstream, device=device))
        results.append([output.numpy(), layer.weight.grad.numpy()])
        if weighted:
            results[-1].append(per_sample.grad.numpy())
    for on_cpu, on_device in zip(*results, strict=True):
        np.testing.assert_allclose(on_device, on_cpu, rtol=1e-12, atol=1e-14)


def test_bad_ids_and_offsets_on_a_device_are_reported_at_the_sync_point():
    from bigdl_py import device_waits

    layer = build({}).to("strict")
    with device_waits.no_device_waits():
        layer(Tensor(np.array([[1, 9]]), device="strict"))
        with pytest.raises(IndexError, match="got min 1 and max 9"):
            device_waits.raise_deferred_checks()
        layer(Tensor(FLAT, device="strict"), Tensor(np.array([0, 5, 3]), device="strict"))
        with pytest.raises(ValueError, match="never decrease"):
            device_waits.raise_deferred_checks()


def test_integer_per_sample_weights_are_refused_naming_the_layer():
    # PyTorch too wants the table's dtype; integer weights could not get a gradient either.
    bag = nn.EmbeddingBag(10, 3, mode="sum")
    indices = np.array([[1, 2]])
    with pytest.raises(TypeError, match=r"EmbeddingBag\(.*per_sample_weights must be floating"):
        bag(indices, per_sample_weights=np.array([[1, 2]]))
    weighted = bag(indices, per_sample_weights=np.array([[1.0, 2.0]], dtype=np.float32))
    expected = bag.weight.numpy()[1] + 2 * bag.weight.numpy()[2]
    np.testing.assert_allclose(weighted.numpy()[0], expected, rtol=1e-6)
