"""``TrainingCallback``: what the training loop tells an observer (experiment trackers).

The loop (:class:`~bigdl_py.train.loop.BaseOptimizer`) calls every callback added with
``add_callback`` at four points, on the driver, for local and distributed training alike.
Each hook does nothing by default, so a callback implements only the ones it needs; see
:class:`bigdl_py.train.MLflowSummary` for one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from bigdl_py.train.metrics import ValidationResult
from bigdl_py.train.triggers import TrainingState


class TrainingCallback:
    """Base class of the loop's observers; every hook is optional."""

    def on_train_begin(self, optimizer: Any) -> None:
        """``optimizer.optimize()`` starts (after a resume has put the state back)."""

    def on_iteration_end(
        self, state: TrainingState, loss: float, throughput: float, learning_rate: float | None
    ) -> None:
        """Iteration ``state.iteration`` ended with this mean ``loss`` (finite losses only)."""

    def on_validation_end(self, state: TrainingState, results: Sequence[ValidationResult]) -> None:
        """Validation ran after iteration ``state.iteration``."""

    def on_train_end(self, optimizer: Any, model: Any, error: BaseException | None) -> None:
        """``optimize()`` ends: ``model`` is the returned model, ``error`` what stopped it."""
