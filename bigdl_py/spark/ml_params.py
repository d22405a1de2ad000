"""The Spark ML params of the ``NN*`` pipeline stages (:mod:`bigdl_py.spark.ml`).

Every param value is plain JSON, so Spark ML's metadata file stores it and ``copy()`` never
shares mutable state between stages: an OptimMethod is kept as its ``config()`` (a fresh
instance is built for every ``fit``), a Trigger as the small description
:func:`trigger_config` makes. Camel case belongs to this layer only (Spark ML's own naming).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasLabelCol, HasPredictionCol, HasProbabilityCol

from bigdl_py.optim import OptimMethod, optim_method_from_config
from bigdl_py.train.early_stopping import EarlyStopping
from bigdl_py.train.triggers import (
    And,
    EveryEpoch,
    MaxEpoch,
    MaxIteration,
    MaxScore,
    MinLoss,
    Or,
    SeveralIteration,
    Trigger,
    check_trigger,
)

# --- triggers as JSON -------------------------------------------------------------------------

# Name -> (class, constructor argument = attribute name); And/Or take their triggers instead.
_TRIGGERS: dict[str, tuple[type, str | None]] = {
    "MaxEpoch": (MaxEpoch, "max_epoch"),
    "MaxIteration": (MaxIteration, "max_iteration"),
    "EveryEpoch": (EveryEpoch, None),
    "SeveralIteration": (SeveralIteration, "interval"),
    "MinLoss": (MinLoss, "min_loss"),
    "MaxScore": (MaxScore, "max_score"),
}
_COMBINATIONS: dict[str, type] = {"And": And, "Or": Or}
# Triggers of several constructor arguments: name -> (class, argument = attribute names).
_MULTI_ARGUMENT: dict[str, tuple[type, tuple[str, ...]]] = {
    "EarlyStopping": (
        EarlyStopping,
        ("metric", "mode", "patience", "min_delta", "restore_best"),
    ),
}


def trigger_config(trigger: Trigger) -> dict:
    """A JSON description of one of bigdl_py's triggers (combinations included).

    Raises
    ------
    TypeError
        For a Trigger subclass of the user's own, which cannot be described safely.
    """
    name = type(trigger).__name__
    if name in _COMBINATIONS and type(trigger) is _COMBINATIONS[name]:
        return {"name": name, "triggers": [trigger_config(part) for part in trigger.triggers]}
    if name in _MULTI_ARGUMENT and type(trigger) is _MULTI_ARGUMENT[name][0]:
        return {"name": name, **{key: getattr(trigger, key) for key in _MULTI_ARGUMENT[name][1]}}
    if name in _TRIGGERS and type(trigger) is _TRIGGERS[name][0]:
        argument = _TRIGGERS[name][1]
        return (
            {"name": name}
            if argument is None
            else {"name": name, argument: getattr(trigger, argument)}
        )
    known = sorted([*_TRIGGERS, *_MULTI_ARGUMENT, *_COMBINATIONS])
    raise TypeError(
        f"cannot store trigger {trigger!r} in a Spark ML param; use one of {known} "
        "(combined with & and | as needed)"
    )


def trigger_from_config(config: Mapping[str, Any]) -> Trigger:
    """Rebuild a trigger described by :func:`trigger_config`; never imports anything."""
    name = config.get("name")
    if name in _COMBINATIONS:
        return _COMBINATIONS[name](*(trigger_from_config(part) for part in config["triggers"]))
    if name in _MULTI_ARGUMENT:
        cls, arguments = _MULTI_ARGUMENT[name]
        return cls(**{key: config[key] for key in arguments if key in config})
    if name not in _TRIGGERS:
        known = sorted([*_TRIGGERS, *_MULTI_ARGUMENT, *_COMBINATIONS])
        raise ValueError(f"unknown trigger {name!r}; known: {known}")
    cls, argument = _TRIGGERS[name]
    return cls() if argument is None else cls(config[argument])


# --- type converters: each turns what a user passes into a JSON value, or raises ----------------


def _optional(convert):
    """``convert``, letting None through (None means "not set", e.g. in a loaded stage)."""

    def convert_optional(value: Any) -> Any:
        return None if value is None else convert(value)

    return convert_optional


def _as_json(value: Any) -> Any:
    """``value`` after a JSON round trip (tuples become lists; anything else raises)."""
    return json.loads(json.dumps(value))


def to_column_spec(value: Any) -> str | list:
    """One column name, several names (concatenated per row), or one list per model input."""
    if isinstance(value, str):
        return value
    if isinstance(value, Sequence) and value:
        if all(isinstance(item, str) for item in value):
            return list(value)
        if all(
            isinstance(group, Sequence)
            and not isinstance(group, str)
            and group
            and all(isinstance(item, str) for item in group)
            for group in value
        ):
            return [list(group) for group in value]
    raise TypeError(
        f"featuresCol must be a column name, a list of names, or a list of lists of names (one "
        f"per model input), got {value!r}"
    )


def _to_shape(value: Any) -> list[int]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"a shape must be a list of positive integers, got {value!r}")
    shape = [TypeConverters.toInt(size) for size in value]
    if any(size < 1 for size in shape):
        raise ValueError(f"a shape must hold positive integers, got {value!r}")
    return shape


def to_feature_shape(value: Any) -> list:
    """A per-row shape such as ``[1, 28, 28]``, or one shape (or None) per model input."""
    if (
        isinstance(value, Sequence)
        and value
        and all(
            item is None or (isinstance(item, Sequence) and not isinstance(item, str))
            for item in value
        )
    ):
        return [None if item is None else _to_shape(item) for item in value]
    return _to_shape(value)


def _positive_int(name: str):
    def convert(value: Any) -> int:
        number = TypeConverters.toInt(value)
        if number < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
        return number

    return convert


def to_update_mode(value: Any) -> str:
    """A training mode's name (``"auto"``, ``"sharded"``, ``"replicated"``, ``"local-sgd"``,
    ``"local-sgd:PERIOD[:WARMUP]"``, ``"pipeline:STAGES[:MICRO_BATCHES[:REPLICAS]]"``) or a
    ``LocalSGD`` or ``Pipeline`` object, as its name."""
    from bigdl_py.spark.modes import resolve_mode

    if hasattr(value, "period") and hasattr(value, "warmup_iterations"):  # a LocalSGD
        value = f"local-sgd:{value.period}:{value.warmup_iterations}"
    if hasattr(value, "settings_name"):  # a Pipeline
        try:
            value = value.settings_name()
        except ValueError as error:
            raise ValueError(f"updateMode: {error}") from None
    mode = TypeConverters.toString(value)
    if mode != "auto":
        try:
            resolve_mode(mode)
        except ValueError as error:
            raise ValueError(f"updateMode: {error}") from None
    return mode


def _non_negative_float(name: str):
    def convert(value: Any) -> float:
        number = TypeConverters.toFloat(value)
        if not number >= 0:
            raise ValueError(f"{name} must be >= 0, got {value!r}")
        return number

    return convert


def to_optim_config(value: Any) -> dict:
    """An OptimMethod (or its ``config()``) as a checked JSON config."""
    if isinstance(value, OptimMethod):
        config = _as_json(value.config())
    elif isinstance(value, Mapping):
        config = _as_json(dict(value))
    else:
        raise TypeError(
            "optimMethod must be a bigdl_py.optim OptimMethod (SGD, Adam, ...) or its config(), "
            f"got {type(value).__name__}"
        )
    # Raises ValueError naming an unknown method. Grouped methods depend on one model's
    # parameter layout, which the training loop does not take (yet).
    if not isinstance(optim_method_from_config(config), OptimMethod):
        raise TypeError(f"optimMethod must be a single OptimMethod, got {config.get('name')!r}")
    return config


def to_trigger_config(value: Any) -> dict:
    """A Trigger (or its :func:`trigger_config`) as a checked JSON config."""
    if isinstance(value, Trigger):
        return trigger_config(value)
    if isinstance(value, Mapping):
        config = _as_json(dict(value))
        trigger_from_config(config)
        return config
    raise TypeError(f"expected a Trigger such as MaxEpoch(5), got {type(value).__name__}")


def to_checkpoint_trigger_config(value: Any) -> dict:
    """:func:`to_trigger_config`, refusing a trigger that can only end training."""
    config = to_trigger_config(value)
    check_trigger(trigger_from_config(config), "checkpoint trigger")
    return config


def to_clipping_range(value: Any) -> list[float]:
    bounds = TypeConverters.toListFloat(value)
    if len(bounds) != 2 or not bounds[0] <= bounds[1]:
        raise ValueError(f"constant clipping needs [min, max] with min <= max, got {value!r}")
    return bounds


def to_device(value: Any) -> str:
    from bigdl_py.spark.gpu import check_device_request

    return check_device_request(TypeConverters.toString(value))


# --- the params ----------------------------------------------------------------------------------


class HasFeaturesCol(Params):
    """``featuresCol``: like Spark's, and also a list of columns (concatenated, or per input)."""

    featuresCol = Param(
        Params._dummy(),
        "featuresCol",
        "features column name: an array or Vector column, a list of numeric/array columns "
        "(concatenated per row), or a list of lists (one per model input)",
        typeConverter=to_column_spec,
    )

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(featuresCol="features")

    def getFeaturesCol(self) -> str | list:
        return self.getOrDefault(self.featuresCol)


class NNModelParams(HasFeaturesCol, HasPredictionCol):
    """What ``NNModel.transform`` needs: columns, batch size, per-row shape, device."""

    batchSize = Param(
        Params._dummy(),
        "batchSize",
        "rows per forward pass (in fit: the global batch of one update)",
        typeConverter=_positive_int("batchSize"),
    )
    featureShape = Param(
        Params._dummy(),
        "featureShape",
        "per-row shape of the features, e.g. [1, 28, 28] for flat image arrays; unset: the "
        "column's own shape",
        typeConverter=_optional(to_feature_shape),
    )
    device = Param(
        Params._dummy(),
        "device",
        "where transform computes on each executor: cpu, auto, gpu or cuda:<n>",
        typeConverter=to_device,
    )

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(batchSize=256, featureShape=None, device="cpu")

    def getBatchSize(self) -> int:
        return self.getOrDefault(self.batchSize)

    def getFeatureShape(self) -> list | None:
        return self.getOrDefault(self.featureShape)

    def getDevice(self) -> str:
        return self.getOrDefault(self.device)

    def feature_shape(self) -> tuple | list | None:
        """``featureShape`` in the form ``bigdl_py.data.table_to_arrays`` takes."""
        shape = self.getFeatureShape()
        if shape is None or not shape or isinstance(shape[0], int):
            return None if shape is None else tuple(shape)
        return [None if item is None else tuple(item) for item in shape]


class NNEstimatorParams(NNModelParams, HasLabelCol):
    """What ``NNEstimator.fit`` needs on top of :class:`NNModelParams`."""

    maxEpoch = Param(
        Params._dummy(),
        "maxEpoch",
        "epochs to train (ignored when endWhen is set)",
        typeConverter=_positive_int("maxEpoch"),
    )
    endWhen = Param(
        Params._dummy(),
        "endWhen",
        "when to stop training, a Trigger (stored as its JSON description)",
        typeConverter=_optional(to_trigger_config),
    )
    learningRate = Param(
        Params._dummy(),
        "learningRate",
        "learning rate of the default SGD; when set together with optimMethod it replaces "
        "that method's lr",
        typeConverter=_non_negative_float("learningRate"),
    )
    optimMethod = Param(
        Params._dummy(),
        "optimMethod",
        "the OptimMethod, stored as its config() (a fresh instance is built for each fit)",
        typeConverter=_optional(to_optim_config),
    )
    numPartitions = Param(
        Params._dummy(),
        "numPartitions",
        "data partitions = model replicas (default: the cluster's task slots)",
        typeConverter=_optional(_positive_int("numPartitions")),
    )
    updateMode = Param(
        Params._dummy(),
        "updateMode",
        'the training mode (DistriOptimizer(update=)): "auto" (default: one-task in local '
        'mode; on a cluster replicated for small models, else sharded), "one-task" (the '
        'partitions train at once in one task per job: exact), "sharded" (BigDL\'s '
        'AllReduce: each partition steps its slice), "replicated" (every partition steps the '
        'whole vector: one Spark stage per iteration), "local-sgd:PERIOD[:WARMUP]" (periodic '
        'model averaging, not exact) or "pipeline:STAGES[:MICRO_BATCHES[:REPLICAS]]" (the '
        "model cut into stages, GPipe's schedule: exact)",
        typeConverter=to_update_mode,
    )
    seed = Param(
        Params._dummy(),
        "seed",
        "seed of every partition's per-epoch shuffle and of the replicas' random streams",
        typeConverter=TypeConverters.toInt,
    )
    checkpointPath = Param(
        Params._dummy(),
        "checkpointPath",
        "directory for training checkpoints (unset: no checkpoints)",
        typeConverter=_optional(TypeConverters.toString),
    )
    checkpointTrigger = Param(
        Params._dummy(),
        "checkpointTrigger",
        "when to write a checkpoint (default EveryEpoch)",
        typeConverter=_optional(to_checkpoint_trigger_config),
    )
    checkpointOverwrite = Param(
        Params._dummy(),
        "checkpointOverwrite",
        "keep only the two newest checkpoints (True) or all of them (False)",
        typeConverter=TypeConverters.toBoolean,
    )
    constantGradientClipping = Param(
        Params._dummy(),
        "constantGradientClipping",
        "[min, max]: clamp every gradient element into this range",
        typeConverter=_optional(to_clipping_range),
    )
    gradientL2NormClipping = Param(
        Params._dummy(),
        "gradientL2NormClipping",
        "scale each gradient so that its global L2 norm is at most this",
        typeConverter=_optional(_non_negative_float("gradientL2NormClipping")),
    )

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(
            batchSize=32,
            maxEpoch=10,
            learningRate=1e-3,
            updateMode="auto",
            seed=0,
            checkpointOverwrite=True,
        )

    def getMaxEpoch(self) -> int:
        return self.getOrDefault(self.maxEpoch)

    def optional_param(self, param: Param) -> Any:
        """The value of a param without a default, or None when it is not set."""
        return self.getOrDefault(param) if self.isDefined(param) else None

    def getEndWhen(self) -> Trigger | None:
        config = self.optional_param(self.endWhen)
        return None if config is None else trigger_from_config(config)

    def getLearningRate(self) -> float:
        return self.getOrDefault(self.learningRate)

    def getOptimMethod(self) -> OptimMethod | None:
        """A fresh instance of the method set with ``setOptimMethod`` (None: default SGD)."""
        config = self.optional_param(self.optimMethod)
        return None if config is None else optim_method_from_config(config)

    def getNumPartitions(self) -> int | None:
        return self.optional_param(self.numPartitions)

    def getSeed(self) -> int:
        return self.getOrDefault(self.seed)

    def getUpdateMode(self) -> str:
        return self.getOrDefault(self.updateMode)


class NNClassifierModelParams(NNModelParams, HasProbabilityCol):
    """``NNClassifierModel``: class index prediction plus an optional probability column."""


__all__ = [
    "HasFeaturesCol",
    "HasLabelCol",
    "HasPredictionCol",
    "HasProbabilityCol",
    "NNClassifierModelParams",
    "NNEstimatorParams",
    "NNModelParams",
    "to_column_spec",
    "to_feature_shape",
    "to_optim_config",
    "to_trigger_config",
    "trigger_config",
    "trigger_from_config",
]
