"""Learning-rate schedules against torch.optim.lr_scheduler, composition, Plateau, resume."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bigdl_py.optim import (
    SGD,
    Adam,
    Constant,
    Cosine,
    EpochStep,
    Exponential,
    InverseTimeDecay,
    MultiStep,
    Plateau,
    Poly,
    Step,
    Warmup,
    schedule_from_config,
)

BASE_LR = 0.4


def _our_rates(schedule, iterations):
    """The learning rate each of ``iterations`` updates would use."""
    method = SGD(lr=BASE_LR, schedule=schedule)
    rates = []
    for completed in range(iterations):
        rates.append(method.current_learning_rate())
        method.on_iteration_end(completed + 1)
    return rates


def _torch_rates(torch, make_scheduler, iterations):
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([parameter], lr=BASE_LR)
    scheduler = make_scheduler(optimizer)
    rates = []
    for _ in range(iterations):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return rates


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (lambda: Step(3, 0.5), lambda s, o: s.StepLR(o, step_size=3, gamma=0.5)),
        (lambda: MultiStep([2, 5, 9], 0.3), lambda s, o: s.MultiStepLR(o, [2, 5, 9], 0.3)),
        (lambda: Exponential(1, 0.9), lambda s, o: s.ExponentialLR(o, gamma=0.9)),
        (lambda: Poly(2.0, 10), lambda s, o: s.PolynomialLR(o, total_iters=10, power=2.0)),
        (lambda: Cosine(7, eta_min=0.01), lambda s, o: s.CosineAnnealingLR(o, 7, eta_min=0.01)),
        (
            lambda: InverseTimeDecay(0.3),
            lambda s, o: s.LambdaLR(o, lambda step: 1 / (1 + 0.3 * step)),
        ),
        (
            lambda: Warmup(4, then=Step(3, 0.5), start_factor=0.25),
            lambda s, o: s.SequentialLR(
                o,
                [s.LinearLR(o, start_factor=0.25, total_iters=4), s.StepLR(o, 3, 0.5)],
                milestones=[4],
            ),
        ),
        (
            lambda: Warmup(5, then=Cosine(8, eta_min=0.05)),
            lambda s, o: s.SequentialLR(
                o,
                [s.LinearLR(o, start_factor=0.1, total_iters=5), s.CosineAnnealingLR(o, 8, 0.05)],
                milestones=[5],
            ),
        ),
    ],
    ids=["Step", "MultiStep", "Exponential", "Poly", "Cosine", "InverseTime", "Warmup+Step",
         "Warmup+Cosine"],
)  # fmt: skip
def test_iteration_schedules_match_torch(ours, theirs, torch):
    iterations = 25
    expected = _torch_rates(torch, lambda o: theirs(torch.optim.lr_scheduler, o), iterations)
    np.testing.assert_allclose(_our_rates(ours(), iterations), expected, rtol=1e-10, atol=1e-15)


def test_exponential_staircase_and_decay_step():
    rates = _our_rates(Exponential(decay_step=4, decay_rate=0.5, staircase=True), 12)
    assert rates == [BASE_LR * 0.5 ** (i // 4) for i in range(12)]
    smooth = _our_rates(Exponential(decay_step=4, decay_rate=0.5), 12)
    np.testing.assert_allclose(smooth, [BASE_LR * 0.5 ** (i / 4) for i in range(12)])


def test_epoch_step_follows_epochs_not_iterations(torch):
    epochs, per_epoch = 7, 3
    method = SGD(lr=BASE_LR, schedule=EpochStep(2, gamma=0.1))
    ours = []
    for epoch in range(epochs):
        rates = []
        for _ in range(per_epoch):
            rates.append(method.current_learning_rate())
            method.on_iteration_end()
        assert len(set(rates)) == 1  # constant within an epoch
        ours.append(rates[0])
        method.on_epoch_end(epoch + 1)
    expected = _torch_rates(torch, lambda o: torch.optim.lr_scheduler.StepLR(o, 2, 0.1), epochs)
    np.testing.assert_allclose(ours, expected, rtol=1e-12)
    assert method.iteration == epochs * per_epoch


@pytest.mark.parametrize(
    "options",
    [
        {"mode": "min", "factor": 0.5, "patience": 1},
        {"mode": "max", "factor": 0.2, "patience": 0, "cooldown": 2},
        {"mode": "min", "threshold": 0.05, "threshold_mode": "abs", "patience": 1},
        {"mode": "max", "threshold": 0.1, "threshold_mode": "rel", "min_lr": 0.01, "factor": 0.3},
        {"mode": "min", "threshold": 0.1, "patience": 0},  # negative metrics: torch's rel rule
    ],
)
def test_plateau_matches_torch_reduce_on_plateau(options, torch, rng):
    metrics = np.cumsum(rng.normal(0, 1, 40)) * (-1 if "min_lr" in options else 1)
    method = Adam(lr=BASE_LR, schedule=Plateau(**options))
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.Adam([parameter], lr=BASE_LR)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, **options)
    ours, theirs = [], []
    for epoch, metric in enumerate(metrics):
        method.on_epoch_end(epoch + 1, validation_score=float(metric))
        scheduler.step(float(metric))
        ours.append(method.current_learning_rate())
        theirs.append(optimizer.param_groups[0]["lr"])
    np.testing.assert_allclose(ours, theirs, rtol=1e-12)
    assert min(ours) < BASE_LR  # the sequence did trigger cuts


def test_plateau_ignores_epochs_without_a_score():
    method = SGD(lr=1.0, schedule=Plateau(mode="min", patience=0, factor=0.5))
    method.on_epoch_end(1, validation_score=1.0)
    for epoch in range(2, 6):
        method.on_epoch_end(epoch)
    assert method.current_learning_rate() == 1.0
    method.on_epoch_end(6, validation_score=2.0)
    assert method.current_learning_rate() == 0.5


def test_plateau_state_round_trip_continues_exactly(rng):
    metrics = rng.normal(0, 1, 30)
    original = Warmup(3, then=Plateau(mode="min", patience=1, factor=0.5, cooldown=1))
    for metric in metrics[:12]:
        original.observe(metric)
    resumed = Warmup(3, then=Plateau(mode="min", patience=1, factor=0.5, cooldown=1))
    resumed.load_state_dict(original.state_dict())
    assert set(original.state_dict()) == {
        "then.best",
        "then.bad_observations",
        "then.cooldown_left",
        "then.scale",
    }
    for metric in metrics[12:]:
        original.observe(metric)
        resumed.observe(metric)
        assert resumed.learning_rate(1.0, 10, 0) == original.learning_rate(1.0, 10, 0)


def test_a_plateau_fed_by_hand_needs_a_mode():
    """Without a mode it follows the validation score's method, which only training knows;
    a metric fed by hand is refused rather than read as a loss."""
    method = SGD(lr=1.0, schedule=Plateau(patience=0, factor=0.5))
    with pytest.raises(ValueError, match="direction of the metric is not known: pass mode="):
        method.on_epoch_end(1, validation_score=0.5)


@pytest.mark.parametrize(
    "mode, scores, cut",
    [("max", [0.5, 0.6, 0.7], False), ("min", [3, 2, 1], False), ("max", [0.7, 0.6, 0.5], True)],
)
def test_a_followed_mode_decides_what_improves(mode, scores, cut):
    plateau = Plateau(patience=0, factor=0.5)
    assert plateau.metric_schedules() == [plateau]
    assert Warmup(2, then=plateau).metric_schedules() == [plateau]
    assert Step(3, 0.5).metric_schedules() == []
    plateau.follow_mode(mode)
    for score in scores:
        plateau.observe(score)
    assert (plateau.learning_rate(1.0, 0, 0) < 1.0) is cut


def test_method_state_dict_carries_counters_and_schedule_state():
    method = SGD(lr=1.0, schedule=Plateau(mode="min", patience=0, factor=0.5))
    for epoch, score in enumerate([3.0, 4.0, 5.0], start=1):
        method.on_iteration_end(epoch * 10)
        method.on_epoch_end(epoch, validation_score=score)
    state = method.state_dict()
    assert (state["iteration"], state["epoch"], state["schedule.scale"]) == (30, 3, 0.25)
    resumed = SGD(lr=1.0, schedule=Plateau(mode="min", patience=0, factor=0.5))
    resumed.load_state_dict(state)
    assert resumed.current_learning_rate() == method.current_learning_rate() == 0.25
    with pytest.raises(ValueError, match="keeps no state"):
        SGD(lr=1.0).load_state_dict(state)


def test_schedule_drives_the_update_like_torch(torch, rng):
    size = 9
    weight = rng.standard_normal(size)
    method = Adam(lr=0.05, schedule=Warmup(3, then=Step(4, 0.5)))
    parameter = torch.nn.Parameter(torch.tensor(weight.copy()))
    optimizer = torch.optim.Adam([parameter], lr=0.05)
    lr = torch.optim.lr_scheduler
    scheduler = lr.SequentialLR(
        optimizer,
        [lr.LinearLR(optimizer, start_factor=0.1, total_iters=3), lr.StepLR(optimizer, 4, 0.5)],
        milestones=[3],
    )
    for iteration in range(15):
        gradient = rng.standard_normal(size)
        method.step(weight, gradient)
        method.on_iteration_end(iteration + 1)
        parameter.grad = torch.tensor(gradient.copy())
        optimizer.step()
        scheduler.step()
    np.testing.assert_allclose(weight, parameter.detach().numpy(), rtol=1e-6)


def test_counters_protocol():
    method = SGD(lr=1.0, schedule=Step(2, 0.5))
    method.on_iteration_end()
    method.on_iteration_end()
    assert method.iteration == 2 and method.current_learning_rate() == 0.5
    method.schedule_step(iteration=6, epoch=4)
    assert (method.iteration, method.epoch) == (6, 4)
    assert method.current_learning_rate() == 0.125
    method.on_epoch_end()
    assert method.epoch == 5


@pytest.mark.parametrize(
    "schedule",
    [
        Constant(),
        Step(3, 0.5, unit="epoch"),
        EpochStep(2, 0.3),
        MultiStep([1, 4], 0.1),
        Exponential(3, 0.7, staircase=True),
        InverseTimeDecay(0.01),
        Poly(0.5, 100),
        Cosine(50, 0.001),
        Warmup(10, then=Plateau(mode="max", patience=3), start_factor=0.5),
    ],
    ids=lambda schedule: type(schedule).__name__,
)
def test_schedule_config_round_trip(schedule):
    rebuilt = schedule_from_config(schedule.config())
    assert type(rebuilt) is type(schedule) and rebuilt.config() == schedule.config()
    for iteration, epoch in [(0, 0), (7, 1), (60, 5)]:
        assert rebuilt.learning_rate(0.3, iteration, epoch) == schedule.learning_rate(
            0.3, iteration, epoch
        )


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Step(0, 0.5), "step_size must be an integer >= 1, got 0"),
        (lambda: Step(2, -0.5), "gamma must be > 0"),
        (lambda: Step(2, 0.5, unit="batch"), "unit must be 'iteration' or 'epoch'"),
        (lambda: MultiStep([3, 2]), "milestones must be increasing"),
        (lambda: Exponential(1, 0), "decay_rate must be > 0"),
        (lambda: Poly(-1, 10), "power must be >= 0"),
        (lambda: Cosine(0), "T_max must be an integer >= 1"),
        (lambda: Warmup(5, start_factor=0), r"start_factor must be in \(0, 1\]"),
        (lambda: Plateau(mode="best"), "mode must be 'min', 'max' or None"),
        (lambda: Plateau(factor=1.0), r"factor must be in \(0, 1\)"),
        (lambda: Plateau(patience=-1), "patience must be an integer >= 0"),
        (lambda: schedule_from_config({"name": "Lambda"}), "unknown schedule 'Lambda'"),
    ],
)
def test_bad_schedule_arguments_raise(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_cosine_is_periodic_like_torch_closed_form():
    cosine = Cosine(4, eta_min=0.0)
    assert cosine.learning_rate(1.0, 4, 0) == pytest.approx(0.0, abs=1e-15)
    assert cosine.learning_rate(1.0, 8, 0) == pytest.approx(1.0)
    assert cosine.learning_rate(1.0, 2, 0) == pytest.approx((1 + math.cos(math.pi / 2)) / 2)
