"""``LocalOptimizer`` (train in this process) and ``Optimizer``, the front door that picks one.

``Optimizer(model, training_set, criterion, optim_method, end_trigger, batch_size)`` returns a
``LocalOptimizer`` for in-memory data (an ``ArrayDataset`` or ``(features, labels)`` arrays)
and a ``DistriOptimizer`` (``bigdl_py.spark.distri_optimizer``) for a PySpark RDD or
DataFrame. Both are :class:`~bigdl_py.train.loop.BaseOptimizer`: the same setters, triggers,
validation, checkpoints and summaries; only the runner of one iteration differs.
"""

from __future__ import annotations

import importlib
from typing import Any

from bigdl_py.data.spark_types import is_spark_data
from bigdl_py.nn.module import Module
from bigdl_py.optim import OptimMethod
from bigdl_py.train.batches import as_array_dataset
from bigdl_py.train.loop import BaseOptimizer
from bigdl_py.train.progress import Progress
from bigdl_py.train.runner import LocalRunner
from bigdl_py.train.triggers import Trigger

_DISTRIBUTED_MODULE = "bigdl_py.spark.distri_optimizer"


class LocalOptimizer(BaseOptimizer):
    """Train ``model`` in this process (on the model's device: CPU, or GPU through CuPy).

    Parameters
    ----------
    model : Module
    training_set : ArrayDataset or (features, labels)
        Arrays become ``ArrayDataset(features, labels, shuffle=True, seed=0)``.
    criterion : Module
        The loss (e.g. ``nn.NLLLoss()`` after ``LogSoftmax``, or ``nn.CrossEntropyLoss()``).
    optim_method : OptimMethod
        e.g. ``SGD(lr=0.05, momentum=0.9)`` or ``Adam(lr=1e-3)``.
    batch_size : int, optional
        Default: the dataset's ``batch_size``.
    end_trigger : Trigger, optional
        e.g. ``MaxEpoch(10)``; or call :meth:`set_end_when` later.
    skip_nonfinite_batches : bool
        Skip NaN/Inf-loss batches instead of stopping.
    progress : bool or Progress
    cuda_graphs : bool, optional
        On a GPU, capture the training step in a CUDA graph after a warm-up and replay it
        each iteration (``bigdl_py.step_graph``; ``docs/gpu.md`` gives the rules and what
        makes a step run eagerly). Default: on, unless the environment variable
        ``BIGDL_PY_CUDA_GRAPHS=0``; False turns it off. No effect on the CPU.
    micro_batches : int
        Run each batch as this many contiguous micro-batches in turn, their gradients added
        up (gradient accumulation): the same update as one pass over the batch, except that
        BatchNorm normalises each micro-batch by its own statistics and updates its running
        statistics once per micro-batch — a GPipe pipeline's arithmetic, which
        ``DistriOptimizer(update=Pipeline(...))`` runs over Spark (default 1).
    seed : int, optional
        Key every micro-batch's random layers (dropout) by ``(seed, iteration,
        micro-batch, layer)`` instead of drawing from their generators in turn, so the
        masks do not depend on what ran before: a resumed run draws the same ones, and a
        pipeline run with the same ``seed`` too (``bigdl_py.train.rng.keyed_random_streams``).
        With ``micro_batches`` > 1 or a seed, an iteration runs eagerly (no CUDA graph).

    Examples
    --------
    >>> optimizer = LocalOptimizer(model, train_set, nn.NLLLoss(), SGD(lr=0.05, momentum=0.9),
    ...                            batch_size=128, end_trigger=MaxEpoch(3))
    >>> optimizer.set_validation(EveryEpoch(), test_set, [Top1Accuracy(), Loss()])
    >>> trained = optimizer.optimize()
    """

    def __init__(
        self,
        model: Module,
        training_set: Any,
        criterion: Any,
        optim_method: OptimMethod,
        batch_size: int | None = None,
        end_trigger: Trigger | None = None,
        *,
        skip_nonfinite_batches: bool = False,
        progress: bool | Progress = True,
        cuda_graphs: bool | None = None,
        micro_batches: int = 1,
        seed: int | None = None,
    ):
        if cuda_graphs is not None and not isinstance(cuda_graphs, bool):
            raise TypeError(
                f"LocalOptimizer: cuda_graphs must be True, False or None, got {cuda_graphs!r}"
            )
        if (
            isinstance(micro_batches, bool)
            or not isinstance(micro_batches, int)
            or micro_batches < 1
        ):
            raise ValueError(
                f"LocalOptimizer: micro_batches must be a positive integer, got {micro_batches!r}"
            )
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise ValueError(f"LocalOptimizer: seed must be a non-negative integer, got {seed!r}")
        super().__init__(
            model,
            as_array_dataset(training_set, "training_set"),
            criterion,
            optim_method,
            end_trigger,
            batch_size,
            LocalRunner(cuda_graphs, micro_batches, seed),
            skip_nonfinite_batches=skip_nonfinite_batches,
            progress=progress,
        )

    def _as_validation_set(self, dataset: Any) -> Any:
        return as_array_dataset(dataset, "validation dataset", shuffle=False, train=False)


class Optimizer:
    """BigDL's front door: a ``LocalOptimizer`` or a ``DistriOptimizer`` for the data given.

    Parameters
    ----------
    model, training_set, criterion, optim_method, end_trigger, batch_size
        As for :class:`LocalOptimizer`; a PySpark RDD (of ``Sample``) or DataFrame as
        ``training_set`` selects distributed training on the active SparkSession.
    **options
        Passed to the chosen optimizer (e.g. ``skip_nonfinite_batches``).

    Returns
    -------
    LocalOptimizer or DistriOptimizer
        Constructing an ``Optimizer`` returns an instance of one of them.
    """

    def __new__(
        cls,
        model: Module,
        training_set: Any,
        criterion: Any,
        optim_method: OptimMethod,
        end_trigger: Trigger | None = None,
        batch_size: int | None = None,
        **options: Any,
    ) -> BaseOptimizer:
        if isinstance(end_trigger, int) and isinstance(batch_size, Trigger):
            raise TypeError(
                "Optimizer takes (model, training_set, criterion, optim_method, end_trigger, "
                "batch_size); got a batch size where the end trigger goes — pass them by keyword"
            )
        if is_spark_data(training_set):
            _refuse_spark_connect(training_set)
            target = _distri_optimizer_class()
        else:
            target = LocalOptimizer
        return target(
            model,
            training_set,
            criterion,
            optim_method,
            batch_size=batch_size,
            end_trigger=end_trigger,
            **options,
        )


def _refuse_spark_connect(training_set: Any) -> None:
    """A Spark Connect DataFrame has no RDD API for DistriOptimizer: say so up front."""
    from bigdl_py.spark.session import CONNECT_TRAINING_ALTERNATIVE, require_classic_spark

    require_classic_spark(training_set, "DistriOptimizer", CONNECT_TRAINING_ALTERNATIVE)


def _distri_optimizer_class() -> type:
    try:
        module = importlib.import_module(_DISTRIBUTED_MODULE)
    except ImportError as error:
        raise ImportError(
            "the training set is a Spark RDD/DataFrame, which needs the distributed optimizer "
            f"({_DISTRIBUTED_MODULE}.DistriOptimizer), but it cannot be imported: {error}. "
            "Install pyspark, or pass an ArrayDataset / (features, labels) arrays to train "
            "locally"
        ) from error
    try:
        return module.DistriOptimizer
    except AttributeError:
        raise ImportError(f"{_DISTRIBUTED_MODULE} does not define DistriOptimizer") from None
