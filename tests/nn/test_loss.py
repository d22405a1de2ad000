"""Losses: finite differences, PyTorch parity, target checks and error messages.

One table of loss configurations drives both numerical checks, each crossed with the three
reductions: the gradient of the input (and of a float target) against central differences
in float64, then outputs and gradients against ``torch.nn`` built with the same arguments,
to 1e-5 relative.
"""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py import nn
from bigdl_py.autograd import Tensor, gradcheck

F64 = np.float64
REDUCTIONS = ["mean", "sum", "none"]
CLASS_WEIGHT = np.array([0.5, 2.0, 1.0, 1.5])
ELEMENT_WEIGHT = np.array([[1.0, 0.5, 2.0]])  # broadcasts over the batch of (N, 3) inputs
POS_WEIGHT = np.array([3.0, 0.5, 1.0])


# --- input and target specs ---------------------------------------------------------------
def normal(*shape):
    return ("normal", shape)


def probabilities(*shape):
    """Values in [0.05, 0.95]: away from BCE's clamps, where finite differences break."""
    return ("probabilities", shape)


def soft_labels(*shape):
    """Rows of class probabilities along axis 1 (CrossEntropyLoss's soft targets)."""
    return ("soft_labels", shape)


def classes(*shape, count=4, ignored=False):
    """Integer labels in [0, count); with ``ignored`` two of them are ``ignore_index``."""
    return ("classes", shape, count, ignored)


def make_array(spec, rng) -> np.ndarray:
    kind, shape = spec[0], spec[1]
    if kind == "normal":
        return rng.standard_normal(shape)
    if kind == "probabilities":
        return 0.05 + 0.9 * rng.random(shape)
    if kind == "soft_labels":
        values = rng.random(shape)
        return values / values.sum(axis=1, keepdims=True)
    labels = rng.integers(0, spec[2], size=shape)
    if spec[3]:
        labels.reshape(-1)[[0, 2]] = -100
    return labels


# (id, class name in both libraries, constructor arguments, input spec, target spec)
CASES = [
    ("nll", "NLLLoss", {}, normal(5, 4), classes(5)),
    ("nll_weighted", "NLLLoss", {"weight": CLASS_WEIGHT}, normal(5, 4), classes(5)),
    ("nll_ignore_index", "NLLLoss", {}, normal(6, 4), classes(6, ignored=True)),
    (
        "nll_weighted_ignore_index",
        "NLLLoss",
        {"weight": CLASS_WEIGHT, "ignore_index": 3},
        normal(6, 4),
        classes(6),
    ),
    (
        "nll_spatial_weighted",
        "NLLLoss",
        {"weight": CLASS_WEIGHT},
        normal(2, 4, 3, 2),
        classes(2, 3, 2, ignored=True),
    ),
    ("cross_entropy", "CrossEntropyLoss", {}, normal(5, 4), classes(5)),
    (
        "cross_entropy_weighted",
        "CrossEntropyLoss",
        {"weight": CLASS_WEIGHT},
        normal(5, 4),
        classes(5, ignored=True),
    ),
    (
        "cross_entropy_label_smoothing",
        "CrossEntropyLoss",
        {"label_smoothing": 0.2},
        normal(5, 4),
        classes(5, ignored=True),
    ),
    (
        "cross_entropy_weighted_label_smoothing",
        "CrossEntropyLoss",
        {"weight": CLASS_WEIGHT, "label_smoothing": 0.1},
        normal(6, 4),
        classes(6, ignored=True),
    ),
    (
        "cross_entropy_spatial",
        "CrossEntropyLoss",
        {"weight": CLASS_WEIGHT, "label_smoothing": 0.1},
        normal(2, 4, 3),
        classes(2, 3),
    ),
    (
        "cross_entropy_probability_targets",
        "CrossEntropyLoss",
        {"weight": CLASS_WEIGHT, "label_smoothing": 0.1},
        normal(5, 4),
        soft_labels(5, 4),
    ),
    ("mse", "MSELoss", {}, normal(4, 3), normal(4, 3)),
    ("l1", "L1Loss", {}, normal(4, 3), normal(4, 3)),
    ("smooth_l1", "SmoothL1Loss", {}, normal(4, 3), normal(4, 3)),
    ("smooth_l1_beta", "SmoothL1Loss", {"beta": 0.5}, normal(4, 3), normal(4, 3)),
    ("smooth_l1_beta_0", "SmoothL1Loss", {"beta": 0.0}, normal(4, 3), normal(4, 3)),
    ("bce", "BCELoss", {}, probabilities(4, 3), probabilities(4, 3)),
    (
        "bce_weighted",
        "BCELoss",
        {"weight": ELEMENT_WEIGHT},
        probabilities(4, 3),
        probabilities(4, 3),
    ),
    ("bce_with_logits", "BCEWithLogitsLoss", {}, normal(4, 3), probabilities(4, 3)),
    (
        "bce_with_logits_weights",
        "BCEWithLogitsLoss",
        {"weight": ELEMENT_WEIGHT, "pos_weight": POS_WEIGHT},
        normal(4, 3),
        probabilities(4, 3),
    ),
]

PARAMS = [
    pytest.param(*case[1:], reduction, id=f"{case[0]}-{reduction}")
    for case in CASES
    for reduction in REDUCTIONS
]


def make_inputs(input_spec, target_spec, seed=0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return make_array(input_spec, rng), make_array(target_spec, rng)


def as_tensor(array: np.ndarray) -> Tensor:
    """Float arrays become float64 tensors that require a gradient; labels stay as they are."""
    if array.dtype.kind == "f":
        return Tensor(array, requires_grad=True, dtype=F64)
    return Tensor(array)


@pytest.mark.parametrize("name, kwargs, input_spec, target_spec, reduction", PARAMS)
def test_loss_gradients_match_finite_differences(name, kwargs, input_spec, target_spec, reduction):
    loss = getattr(nn, name)(**kwargs, reduction=reduction)
    prediction, target = (as_tensor(a) for a in make_inputs(input_spec, target_spec))
    checked = [t for t in (prediction, target) if t.requires_grad]
    assert gradcheck(lambda *_: loss(prediction, target), checked)


@pytest.mark.parametrize("name, kwargs, input_spec, target_spec, reduction", PARAMS)
def test_loss_matches_pytorch(torch, name, kwargs, input_spec, target_spec, reduction):
    ours = getattr(nn, name)(**kwargs, reduction=reduction)
    their_kwargs = {
        k: torch.tensor(v) if isinstance(v, np.ndarray) else v for k, v in kwargs.items()
    }
    theirs = getattr(torch.nn, name)(**their_kwargs, reduction=reduction)
    arrays = make_inputs(input_spec, target_spec)
    our_inputs = [as_tensor(a) for a in arrays]
    their_inputs = [torch.tensor(a, requires_grad=a.dtype.kind == "f") for a in arrays]

    our_loss, their_loss = ours(*our_inputs), theirs(*their_inputs)
    np.testing.assert_allclose(our_loss.numpy(), their_loss.detach().numpy(), rtol=1e-5, atol=1e-12)
    upstream = np.random.default_rng(1).standard_normal(our_loss.shape)
    our_loss.backward(upstream)
    their_loss.backward(torch.tensor(upstream))
    for which, mine, reference in zip(("input", "target"), our_inputs, their_inputs, strict=True):
        if mine.requires_grad:
            np.testing.assert_allclose(
                mine.grad.numpy(),
                reference.grad.numpy(),
                rtol=1e-5,
                atol=1e-12,
                err_msg=f"gradient of the {which}",
            )


# --- numerically hard inputs ----------------------------------------------------------------
def run_both(torch, name, prediction, target, **kwargs):
    """Loss value and input gradient from bigdl_py and from PyTorch (float64)."""
    ours = Tensor(prediction, requires_grad=True, dtype=F64)
    our_loss = getattr(nn, name)(**kwargs)(ours, target)
    our_loss.backward()
    theirs = torch.tensor(prediction, requires_grad=True)
    their_loss = getattr(torch.nn, name)(**kwargs)(theirs, torch.tensor(target))
    their_loss.backward()
    return (our_loss.item(), ours.grad.numpy()), (their_loss.item(), theirs.grad.numpy())


def test_bce_clamps_the_log_of_exact_zero_and_one_like_pytorch(torch):
    prediction = np.array([0.0, 1.0, 0.0, 1.0, 0.3])
    target = np.array([1.0, 0.0, 0.0, 1.0, 1.0])
    (our_loss, our_grad), (their_loss, their_grad) = run_both(torch, "BCELoss", prediction, target)
    assert np.isfinite(our_loss) and np.all(np.isfinite(our_grad))
    np.testing.assert_allclose(our_loss, their_loss, rtol=1e-12)
    # Both floor p * (1 - p) at 1e-12; PyTorch's kernel rounds that floor slightly differently.
    np.testing.assert_allclose(our_grad, their_grad, rtol=1e-6)


@pytest.mark.parametrize("name", ["BCEWithLogitsLoss", "CrossEntropyLoss"])
def test_losses_on_logits_stay_finite_for_huge_logits(torch, name):
    logits = np.array([[1000.0, -1000.0, 0.0], [-800.0, 5.0, 800.0]])
    target = (
        np.array([[0.0, 1.0, 1.0], [1.0, 0.0, 1.0]])
        if name == "BCEWithLogitsLoss"
        else (np.array([1, 0]))
    )
    (our_loss, our_grad), (their_loss, their_grad) = run_both(torch, name, logits, target)
    assert np.isfinite(our_loss) and np.all(np.isfinite(our_grad))
    np.testing.assert_allclose(our_loss, their_loss, rtol=1e-12)
    np.testing.assert_allclose(our_grad, their_grad, rtol=1e-12, atol=1e-300)


# --- targets: accepted forms and dtypes -----------------------------------------------------
@pytest.mark.parametrize("convert", [np.asarray, list, Tensor], ids=["numpy", "list", "tensor"])
def test_class_labels_may_be_a_numpy_array_a_list_or_a_tensor(convert):
    scores = Tensor(np.random.default_rng(0).standard_normal((3, 4)))
    labels = np.array([2, 0, 3])
    expected = nn.CrossEntropyLoss()(scores, labels).item()
    assert nn.CrossEntropyLoss()(scores, convert(labels.tolist())).item() == expected


def test_labels_of_shape_n_by_1_count_as_one_label_per_sample():
    scores = Tensor(np.random.default_rng(0).standard_normal((3, 4)))
    labels = np.array([2, 0, 3])
    expected = nn.NLLLoss()(scores, labels).item()
    assert nn.NLLLoss()(scores, labels.reshape(3, 1)).item() == expected


def test_float32_prediction_with_float64_numpy_target_stays_float32():
    prediction = Tensor(np.ones((2, 3)), dtype=np.float32, requires_grad=True)
    loss = nn.MSELoss()(prediction, np.zeros((2, 3)))
    loss.backward()
    assert loss.dtype == np.float32 and prediction.grad.dtype == np.float32
    assert loss.item() == 1.0


def test_bce_accepts_integer_zero_one_targets():
    prediction = Tensor(np.array([0.2, 0.7]), dtype=F64)
    as_ints = nn.BCELoss()(prediction, np.array([0, 1]))
    as_floats = nn.BCELoss()(prediction, np.array([0.0, 1.0]))
    assert as_ints.item() == as_floats.item()


def test_ignored_labels_may_lie_outside_the_classes_and_add_nothing():
    scores = Tensor(np.random.default_rng(0).standard_normal((3, 4)), requires_grad=True, dtype=F64)
    loss = nn.NLLLoss(reduction="sum")(scores, np.array([1, -100, 2]))
    loss.backward()
    assert loss.item() == pytest.approx(-(scores.numpy()[0, 1] + scores.numpy()[2, 2]))
    assert not scores.grad.numpy()[1].any()


def test_class_weight_is_a_buffer_that_follows_the_dtype():
    loss = nn.NLLLoss(weight=[1.0, 2.0, 3.0])
    assert list(loss.state_dict()) == ["weight"]
    loss.to(dtype=np.float32)
    assert loss.weight.dtype == np.float32


# --- error messages -------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["NLLLoss", "CrossEntropyLoss"])
@pytest.mark.parametrize("bad_label", [4, -1])
def test_out_of_range_label_names_value_position_and_class_count(name, bad_label):
    scores = Tensor(np.zeros((3, 4)))
    with pytest.raises(IndexError) as error:
        getattr(nn, name)()(scores, np.array([0, 1, bad_label]))
    message = str(error.value)
    assert name in message
    assert f"target[2] = {bad_label}" in message
    assert "4 classes" in message


def test_out_of_range_label_of_a_spatial_target_names_its_full_position():
    scores = Tensor(np.zeros((2, 3, 2, 2)))
    labels = np.zeros((2, 2, 2), dtype=int)
    labels[1, 0, 1] = 7
    with pytest.raises(IndexError, match=r"target\[1, 0, 1\] = 7 .* 3 classes"):
        nn.NLLLoss()(scores, labels)


def test_one_based_labels_get_a_hint_about_bigdl():
    with pytest.raises(IndexError, match="0-based"):
        nn.NLLLoss()(Tensor(np.zeros((3, 3))), np.array([1, 2, 3]))


@pytest.mark.parametrize("name", ["NLLLoss", "CrossEntropyLoss"])
def test_float_labels_are_refused_with_a_hint(name):
    with pytest.raises(TypeError, match=r"integer class indices.*float64.*astype\(int\)"):
        getattr(nn, name)()(Tensor(np.zeros((3, 4))), np.array([0.0, 1.0, 2.0]))


@pytest.mark.parametrize("name", ["NLLLoss", "CrossEntropyLoss"])
def test_class_target_of_the_wrong_shape_names_both_shapes(name):
    with pytest.raises(ValueError, match=rf"{name}: input shape \(3, 4\) .*\(3,\).*\(4,\)"):
        getattr(nn, name)()(Tensor(np.zeros((3, 4))), np.array([0, 1, 2, 3]))


def test_one_hot_target_gets_a_hint_to_take_the_argmax():
    with pytest.raises(ValueError, match="one-hot"):
        nn.NLLLoss()(Tensor(np.zeros((2, 3))), np.eye(3, dtype=int)[:2])


@pytest.mark.parametrize(
    "name", ["MSELoss", "L1Loss", "SmoothL1Loss", "BCELoss", "BCEWithLogitsLoss"]
)
def test_element_wise_loss_names_itself_and_both_shapes_on_mismatch(name):
    with pytest.raises(ValueError, match=rf"{name}: input shape \(4, 1\) and target shape \(4,\)"):
        getattr(nn, name)()(Tensor(np.full((4, 1), 0.5)), np.zeros(4))


@pytest.mark.parametrize("name", [case[1] for case in CASES[::3]] + ["L1Loss", "BCELoss"])
def test_bad_reduction_is_refused_at_construction(name):
    with pytest.raises(ValueError, match=rf"{name}: reduction must be one of .*'avg'"):
        getattr(nn, name)(reduction="avg")


def test_class_weight_of_the_wrong_length_is_refused():
    with pytest.raises(ValueError, match="weight has 3 entries but .* 4 classes"):
        nn.CrossEntropyLoss(weight=[1.0, 1.0, 1.0])(Tensor(np.zeros((2, 4))), np.array([0, 1]))


def test_bce_refuses_values_outside_zero_one():
    with pytest.raises(ValueError, match="BCELoss: input must be probabilities in \\[0, 1\\]"):
        nn.BCELoss()(Tensor(np.array([-0.5, 0.5])), np.array([0.0, 1.0]))


def test_element_weight_that_does_not_broadcast_is_refused():
    loss = nn.BCEWithLogitsLoss(pos_weight=[1.0, 2.0])
    with pytest.raises(ValueError, match=r"pos_weight of shape \(2,\) does not broadcast"):
        loss(Tensor(np.zeros((4, 3))), np.zeros((4, 3)))


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: nn.CrossEntropyLoss(label_smoothing=1.5), "label_smoothing must be"),
        (lambda: nn.SmoothL1Loss(beta=-1.0), "beta must be"),
        (lambda: nn.NLLLoss(ignore_index=1.5), "ignore_index must be an int"),
        (lambda: nn.NLLLoss(weight=[[1.0, 2.0]]), "weight must be 1-d"),
    ],
)
def test_bad_settings_are_refused(build, message):
    with pytest.raises((ValueError, TypeError), match=message):
        build()


def test_integer_predictions_are_refused():
    with pytest.raises(TypeError, match="MSELoss: input must be floating point"):
        nn.MSELoss()(Tensor(np.array([1, 2])), np.array([1.0, 2.0]))


@pytest.mark.parametrize("loss", [nn.NLLLoss(), nn.CrossEntropyLoss()], ids=repr)
def test_device_labels_given_as_a_bare_array_are_checked_there(loss):
    """A Spark replica hands labels as a device array: no implicit conversion to NumPy
    (CuPy refuses it), and inside a step a bad label is reported at the sync point."""
    from bigdl_py import backend, device_waits

    scores = Tensor(np.log(np.full((4, 3), 1 / 3, dtype=np.float32)), device="strict")
    labels = backend.to_device(np.array([0, 2, 1, 1]), "strict")
    np.testing.assert_allclose(float(loss(scores, labels).item()), np.log(3), rtol=1e-6)
    bad = backend.to_device(np.array([0, 2, 3, 1]), "strict")
    with device_waits.no_device_waits():
        loss(scores, bad)  # queued; nothing read
        with pytest.raises(IndexError, match=r"target\[2\] = 3"):
            device_waits.raise_deferred_checks()
