"""The training loop shared by every optimizer, and what it is built from.

``LocalOptimizer`` trains in this process; ``Optimizer(...)`` picks it, or the Spark
``DistriOptimizer`` for an RDD or DataFrame. Both run :class:`BaseOptimizer`'s loop —
triggers, validation, checkpoints, summaries, progress, NaN handling — around an
:class:`IterationRunner` that runs one iteration (see ``bigdl_py.train.runner``).
"""

from bigdl_py.train.batches import evaluate_batches, training_batch, validation_batches
from bigdl_py.train.callbacks import TrainingCallback
from bigdl_py.train.checkpoint import (
    Checkpoint,
    CheckpointError,
    CheckpointWarning,
    list_checkpoints,
    load_checkpoint,
)
from bigdl_py.train.early_stopping import EarlyStopping
from bigdl_py.train.loop import BaseOptimizer, NonFiniteLossError
from bigdl_py.train.metrics import (
    MAE,
    Loss,
    Top1Accuracy,
    Top5Accuracy,
    TopKAccuracy,
    ValidationMethod,
    ValidationResult,
)
from bigdl_py.train.mlflow_summary import MLflowSummary
from bigdl_py.train.optimizer import LocalOptimizer, Optimizer
from bigdl_py.train.plots import plot_curves, save_image_grid
from bigdl_py.train.progress import Progress
from bigdl_py.train.runner import IterationResult, IterationRunner, LocalRunner, TrainingSetup
from bigdl_py.train.summary import Summary, TrainSummary, ValidationSummary, read_scalars
from bigdl_py.train.triggers import (
    And,
    EveryEpoch,
    MaxEpoch,
    MaxIteration,
    MaxScore,
    MinLoss,
    Or,
    SeveralIteration,
    TrainingState,
    Trigger,
)

__all__ = [
    "MAE",
    "And",
    "BaseOptimizer",
    "Checkpoint",
    "CheckpointError",
    "CheckpointWarning",
    "EarlyStopping",
    "EveryEpoch",
    "IterationResult",
    "IterationRunner",
    "LocalOptimizer",
    "LocalRunner",
    "Loss",
    "MLflowSummary",
    "MaxEpoch",
    "MaxIteration",
    "MaxScore",
    "MinLoss",
    "NonFiniteLossError",
    "Optimizer",
    "Or",
    "Progress",
    "SeveralIteration",
    "Summary",
    "Top1Accuracy",
    "Top5Accuracy",
    "TopKAccuracy",
    "TrainingCallback",
    "TrainSummary",
    "TrainingSetup",
    "TrainingState",
    "Trigger",
    "ValidationMethod",
    "ValidationResult",
    "ValidationSummary",
    "evaluate_batches",
    "list_checkpoints",
    "load_checkpoint",
    "plot_curves",
    "save_image_grid",
    "read_scalars",
    "training_batch",
    "validation_batches",
]


def __getattr__(name: str):
    """``DistriOptimizer`` lives in ``bigdl_py.spark``; import it only when asked for."""
    if name == "DistriOptimizer":
        from bigdl_py.train.optimizer import _distri_optimizer_class

        return _distri_optimizer_class()
    raise AttributeError(f"module 'bigdl_py.train' has no attribute {name!r}")
