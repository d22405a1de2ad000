"""What to tell a user whose training loss became NaN or infinite.

The usual cause is a step too large (lower the learning rate, clip gradients), but not the
only one: a class loss over a batch whose every target equals ``ignore_index`` averages
over nothing, 0/0, and no learning rate changes that.
"""

from __future__ import annotations

from typing import Any

import numpy as np

DEFAULT_ADVICE = (
    "Lower the learning rate, clip gradients (set_gradient_clipping_by_l2_norm) or pass "
    "skip_nonfinite_batches=True"
)


def batch_labels(training_set: Any, indices: Any) -> np.ndarray | None:
    """The labels of one batch where the driver holds them (an ArrayDataset), else None."""
    labels = getattr(training_set, "labels", None)
    if labels is None or indices is None:
        return None
    return np.asarray(labels)[np.asarray(indices)]


def nonfinite_loss_advice(criterion: Any, labels: np.ndarray | None) -> str:
    """Advice for a NaN/Inf training loss, naming a batch in which no target counted."""
    ignore_index = getattr(criterion, "ignore_index", None)
    reduction = getattr(criterion, "reduction", "mean")
    if labels is not None and ignore_index is not None and reduction == "mean" and labels.size:
        if np.all(labels == ignore_index):
            return (
                f"No target of this batch counted: all {labels.size} equal the criterion's "
                f"ignore_index={ignore_index}, so its mean is 0/0. Check the labels (or the "
                "ignore_index); the learning rate is not the cause"
            )
    return DEFAULT_ADVICE
