"""``Plateau``: cut the learning rate when a validation metric stops improving."""

from __future__ import annotations

import math
from collections.abc import Mapping

from bigdl_py.optim.schedules import Schedule


class Plateau(Schedule):
    """Multiply the learning rate by ``factor`` when the metric has not improved for a while.

    The rules are torch's ``ReduceLROnPlateau`` (and BigDL's Plateau). Each observed metric
    (from :meth:`OptimMethod.on_epoch_end` with a ``validation_score``, usually once per
    epoch) either improves on the best so far, or counts as a bad epoch; after more than
    ``patience`` bad epochs in a row the rate is cut, and the next ``cooldown`` observations do
    not count as bad. The rate never goes below ``min_lr``:
    ``lr = min(base_lr, max(base_lr * factor ** cuts, min_lr))``.

    Trained by an optimizer, the metric is the validation *score*: the value of the first
    method given to ``set_validation``.

    Parameters
    ----------
    mode : {'min', 'max'}, optional
        Whether a smaller (loss) or larger (accuracy) metric is better. By default it follows
        the score's validation method (its ``higher_is_better``), set when training starts,
        as for ``EarlyStopping``; a mode that contradicts that method is refused then. A
        Plateau fed by hand (:meth:`observe`) needs a mode given.
    factor : float
        Multiplier applied at each cut, in ``(0, 1)``.
    patience : int
        Bad observations tolerated before a cut, >= 0.
    threshold : float
        How much better a metric must be to count as an improvement, >= 0.
    threshold_mode : {'rel', 'abs'}
        ``rel``: better than ``best * (1 -/+ threshold)``; ``abs``: than ``best -/+ threshold``.
    cooldown : int
        Observations after a cut during which bad ones are not counted, >= 0.
    min_lr : float
        Lower bound on the learning rate, >= 0.
    eps : float
        A cut that would change the rate by no more than this is skipped (torch's ``eps``);
        applied when :meth:`observe` is given the base rate, as OptimMethods do.
    """

    def __init__(
        self,
        mode: str | None = None,
        factor: float = 0.1,
        patience: int = 10,
        threshold: float = 1e-4,
        threshold_mode: str = "rel",
        cooldown: int = 0,
        min_lr: float = 0.0,
        eps: float = 1e-8,
    ):
        if mode not in (None, "min", "max"):
            raise ValueError(f"Plateau: mode must be 'min', 'max' or None, got {mode!r}")
        if threshold_mode not in ("rel", "abs"):
            raise ValueError(
                f"Plateau: threshold_mode must be 'rel' or 'abs', got {threshold_mode!r}"
            )
        if not 0.0 < factor < 1.0:
            raise ValueError(f"Plateau: factor must be in (0, 1), got {factor!r}")
        for name, value in (("patience", patience), ("cooldown", cooldown)):
            if int(value) != value or value < 0:
                raise ValueError(f"Plateau: {name} must be an integer >= 0, got {value!r}")
        if not threshold >= 0:
            raise ValueError(f"Plateau: threshold must be >= 0, got {threshold!r}")
        if not min_lr >= 0:
            raise ValueError(f"Plateau: min_lr must be >= 0, got {min_lr!r}")
        if not eps >= 0:
            raise ValueError(f"Plateau: eps must be >= 0, got {eps!r}")
        self.mode = mode
        self.factor_per_cut = float(factor)
        self.patience = int(patience)
        self.threshold = float(threshold)
        self.threshold_mode = threshold_mode
        self.cooldown = int(cooldown)
        self.min_lr = float(min_lr)
        self.eps = float(eps)
        self._reset()

    def _reset(self) -> None:
        # Placeholder "nothing seen yet" until an undecided mode is known (``follow_mode``).
        self.best = -math.inf if self.mode == "max" else math.inf
        self.bad_observations = 0
        self.cooldown_left = 0
        self.scale = 1.0

    def metric_schedules(self) -> list[Schedule]:
        return [self]

    def follow_mode(self, mode: str) -> None:
        """Take the mode the training loop derived from the score's validation method
        (``bigdl_py.train.metrics.watching_mode``, which refuses a contradicting one)."""
        if mode not in ("min", "max"):
            raise ValueError(f"Plateau: mode must be 'min' or 'max', got {mode!r}")
        if self.mode is None and math.isinf(self.best):  # nothing observed yet
            self.best = math.inf if mode == "min" else -math.inf
        self.mode = mode

    def learning_rate(self, base_lr: float, iteration: int, epoch: int) -> float:
        return min(base_lr, max(base_lr * self.scale, self.min_lr))

    def _improves(self, metric: float) -> bool:
        if self.mode is None:
            raise ValueError(
                "Plateau: the direction of the metric is not known: pass mode='min' (lower is "
                "better) or mode='max', or train with set_validation, whose first validation "
                "method gives it"
            )
        # torch's comparisons exactly, including its relative threshold on a negative best.
        if math.isinf(self.best):
            return metric < self.best if self.mode == "min" else metric > self.best
        sign = -1.0 if self.mode == "min" else 1.0
        if self.threshold_mode == "rel":
            limit = self.best * (1.0 + sign * self.threshold)
        else:
            limit = self.best + sign * self.threshold
        return metric < limit if self.mode == "min" else metric > limit

    def observe(self, metric: float, base_lr: float | None = None) -> None:
        """Record one validation metric and cut the rate if it has plateaued."""
        metric = float(metric)
        if self._improves(metric):
            self.best = metric
            self.bad_observations = 0
        else:
            self.bad_observations += 1
        if self.cooldown_left > 0:
            self.cooldown_left -= 1
            self.bad_observations = 0
        if self.bad_observations > self.patience:
            if base_lr is None or self._cut_is_significant(base_lr):
                self.scale *= self.factor_per_cut
            self.cooldown_left = self.cooldown
            self.bad_observations = 0

    def _cut_is_significant(self, base_lr: float) -> bool:
        old = self.learning_rate(base_lr, 0, 0)
        new = max(old * self.factor_per_cut, self.min_lr)
        return old - new > self.eps

    def state_dict(self) -> dict:
        return {
            "best": self.best,
            "bad_observations": self.bad_observations,
            "cooldown_left": self.cooldown_left,
            "scale": self.scale,
        }

    def load_state_dict(self, state: Mapping) -> None:
        expected = set(self.state_dict())
        if set(state) != expected:
            raise ValueError(
                f"Plateau.load_state_dict: expected keys {sorted(expected)}, got {sorted(state)}"
            )
        self.best = float(state["best"])
        self.bad_observations = int(state["bad_observations"])
        self.cooldown_left = int(state["cooldown_left"])
        self.scale = float(state["scale"])

    def _arguments(self) -> dict:
        return {
            "mode": self.mode,
            "factor": self.factor_per_cut,
            "patience": self.patience,
            "threshold": self.threshold,
            "threshold_mode": self.threshold_mode,
            "cooldown": self.cooldown,
            "min_lr": self.min_lr,
            "eps": self.eps,
        }
