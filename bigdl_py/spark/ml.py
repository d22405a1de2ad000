"""Spark ML pipeline stages: ``NNEstimator``/``NNClassifier`` train a bigdl_py model,
``NNModel``/``NNClassifierModel`` add its predictions to a DataFrame (BigDL's ``nnframes``).

``fit(df)`` trains a copy of the stage's model with
:class:`~bigdl_py.spark.distri_optimizer.DistriOptimizer` straight from the DataFrame's
columns (through Arrow: array, Vector or numeric columns, so ``VectorAssembler`` and
``StandardScaler`` output works as is) and returns the model stage. ``transform(df)`` runs
:func:`bigdl_py.spark.inference.predict`: the model is broadcast once, each partition is
batched in order, and every input row and column is kept.

Stages save and load by Spark ML's conventions (``stage.save(path)``, ``NNModel.load(path)``,
inside a saved ``Pipeline``/``PipelineModel``) without pickle; see
:mod:`bigdl_py.spark.ml_persistence`. A model with classes of the user's own needs
``bigdl_py.nn.register_module`` in the saving and the loading process.

Examples
--------
>>> assembler = VectorAssembler(inputCols=["x1", "x2"], outputCol="raw")
>>> scaler = StandardScaler(inputCol="raw", outputCol="features")
>>> classifier = (NNClassifier(model, nn.CrossEntropyLoss())
...               .setBatchSize(64).setMaxEpoch(5).setOptimMethod(Adam(lr=1e-2)))
>>> fitted = Pipeline(stages=[assembler, scaler, classifier]).fit(train_df)
>>> fitted.transform(test_df).select("label", "prediction", "probability")
"""

from __future__ import annotations

import copy
import logging
from typing import TYPE_CHECKING, Any

from pyspark.ml import Estimator, Model
from pyspark.ml.param.shared import HasProbabilityCol
from pyspark.ml.util import MLReadable, MLWritable

from bigdl_py.nn import CrossEntropyLoss
from bigdl_py.nn.module import Module
from bigdl_py.nn.serialization import module_config, module_from_config
from bigdl_py.optim import SGD, OptimMethod
from bigdl_py.spark.ml_params import (
    NNClassifierModelParams,
    NNEstimatorParams,
    NNModelParams,
    trigger_from_config,
)
from bigdl_py.spark.ml_persistence import NNStageReader, NNStageWriter
from bigdl_py.train.metrics import ValidationMethod
from bigdl_py.train.progress import Progress
from bigdl_py.train.summary import TrainSummary, ValidationSummary
from bigdl_py.train.triggers import EveryEpoch, MaxEpoch, Trigger, check_trigger

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["NNClassifier", "NNClassifierModel", "NNEstimator", "NNModel", "class_index_column"]


def _check_module(value: Any, what: str, owner: str) -> Module:
    if not isinstance(value, Module):
        raise TypeError(f"{owner}: {what} must be a bigdl_py.nn Module, got {type(value).__name__}")
    return value


def _column_names(spec: Any) -> list[str]:
    if isinstance(spec, str):
        return [spec]
    return [name for item in spec for name in ([item] if isinstance(item, str) else item)]


def _require_columns(df: DataFrame, owner: str, **columns: Any) -> None:
    """Raise ValueError naming the param, the missing column(s) and the columns there are."""
    for param, spec in columns.items():
        missing = [name for name in _column_names(spec) if name not in df.columns]
        if missing:
            raise ValueError(
                f"{owner}: {param} {spec!r} names column(s) {missing} that the DataFrame does "
                f"not have; its columns are {df.columns}"
            )


def class_index_column(df: DataFrame, name: str, owner: str):
    """Column ``name`` of ``df`` as ``long`` class indices, checked to hold whole numbers.

    Spark ML's label columns are doubles (``StringIndexer`` output); class losses need
    integers. A fractional or NaN label raises here (one pass over the column) rather than
    being truncated.

    Raises
    ------
    TypeError
        For a non-numeric column.
    ValueError
        For a value that is not a whole number, naming it.
    """
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    data_type = df.schema[name].dataType
    if not isinstance(data_type, T.NumericType):
        raise TypeError(
            f"{owner}: label column {name!r} has type {data_type.simpleString()}; class labels "
            "must be numbers 0, 1, ... (index strings with StringIndexer)"
        )
    if isinstance(data_type, (T.FloatType, T.DoubleType, T.DecimalType)):
        label = F.col(name)
        not_whole = label != F.floor(label)
        if not isinstance(data_type, T.DecimalType):
            not_whole = not_whole | F.isnan(label)
        bad = df.where(not_whole).select(name).limit(1).collect()
        if bad:
            raise ValueError(
                f"{owner}: label column {name!r} holds {bad[0][0]!r}; class labels must be "
                "whole numbers 0, 1, ..."
            )
    return df[name].cast("long")


class _NNStage(MLWritable):
    """Persistence shared by the four stages: the model in ``data/``, params in metadata."""

    model: Module

    def write(self) -> NNStageWriter:
        return NNStageWriter(self)

    @classmethod
    def read(cls) -> NNStageReader:
        return NNStageReader(cls)

    @classmethod
    def load(cls, path: str) -> Any:
        """Load a stage saved with ``save(path)``."""
        return cls.read().load(path)

    def _saved_extras(self) -> dict:
        return {}

    def _set_params(self, params: dict) -> None:
        """Set constructor keyword params, naming any that this stage does not have."""
        unknown = sorted(name for name in params if not self.hasParam(name))
        if unknown:
            known = sorted(param.name for param in self.params)
            raise TypeError(f"{type(self).__name__} has no param(s) {unknown}; its params: {known}")
        self._set(**params)


# --- models (Transformers) ------------------------------------------------------------------


class NNModel(Model, NNModelParams, _NNStage, MLReadable):
    """A trained bigdl_py model as a Spark ML Transformer.

    ``transform(df)`` adds ``predictionCol``: the model's output for each row, flattened to
    ``array<float>`` (BigDL's NNModel). Row order and every other column are kept.

    Parameters
    ----------
    model : bigdl_py.nn.Module
    **params
        Any params by name, e.g. ``featuresCol="scaled", featureShape=[1, 28, 28]``.

    Params
    ------
    featuresCol ("features"), predictionCol ("prediction"), batchSize (256 rows per forward
    pass), featureShape (unset), device ("cpu").
    """

    _output = "raw"

    def __init__(self, model: Module, **params: Any):
        super().__init__()
        self.model = _check_module(model, "model", type(self).__name__)
        self._set_params(params)

    @classmethod
    def _from_saved(cls, model: Module, extras: dict) -> NNModel:
        return cls(model)

    def setFeaturesCol(self, value: str | list) -> NNModel:
        return self._set(featuresCol=value)

    def setPredictionCol(self, value: str) -> NNModel:
        return self._set(predictionCol=value)

    def setBatchSize(self, value: int) -> NNModel:
        return self._set(batchSize=value)

    def setFeatureShape(self, value: list | tuple | None) -> NNModel:
        return self._set(featureShape=value)

    def setDevice(self, value: str) -> NNModel:
        return self._set(device=value)

    def _predict(self, dataset: DataFrame, prediction_col: str, output: str) -> DataFrame:
        from bigdl_py.spark.inference import predict

        _require_columns(dataset, type(self).__name__, featuresCol=self.getFeaturesCol())
        return predict(
            self.model,
            dataset,
            batch_size=self.getBatchSize(),
            feature_cols=self.getFeaturesCol(),
            prediction_col=prediction_col,
            output=output,
            device=self.getDevice(),
            feature_shape=self.feature_shape(),
        )

    def _transform(self, dataset: DataFrame) -> DataFrame:
        return self._predict(dataset, self.getPredictionCol(), self._output)


class NNClassifierModel(NNModel, NNClassifierModelParams):
    """A trained classifier: ``predictionCol`` is the 0-based class index as a double.

    With ``probabilityCol`` set (default ``"probability"``, ``""`` for none) a Vector column
    of class probabilities is added too, as Spark ML's classifiers do; both come from one
    forward pass. Probabilities are the model's output after ``Softmax``/``Sigmoid``, its
    ``exp`` after ``LogSoftmax``, else a softmax of the logits; a one-column output is a
    binary classifier (probability vector ``[1 - p, p]``, class ``p >= 0.5``).
    """

    def setProbabilityCol(self, value: str) -> NNClassifierModel:
        return self._set(probabilityCol=value)

    def _transform(self, dataset: DataFrame) -> DataFrame:
        probability_col = self.getProbabilityCol()
        prediction_col = self.getPredictionCol()
        if not probability_col:
            return self._predict(dataset, prediction_col, "class")
        from pyspark.ml.functions import array_to_vector
        from pyspark.sql import functions as F

        for name in (prediction_col, probability_col):
            if name in dataset.columns:
                raise ValueError(
                    f"{type(self).__name__}: output column {name!r} is already a column of the "
                    "DataFrame; choose another name or drop it first"
                )
        if prediction_col == probability_col:
            raise ValueError(f"predictionCol and probabilityCol are both {prediction_col!r}")
        scores_col = f"__bigdl_py_probabilities_{self.uid}"
        scored = self._predict(dataset, scores_col, "probabilities")
        scores = F.col(scores_col)
        binary = F.size(scores) == 1
        # Both columns read the one UDF result: Spark plans a single ArrowEvalPython (tested).
        probabilities = F.when(binary, F.array(F.lit(1.0) - scores[0], scores[0])).otherwise(
            scores.cast("array<double>")
        )
        classes = F.when(binary, (scores[0] >= 0.5).cast("double")).otherwise(
            (F.array_position(scores, F.array_max(scores)) - 1).cast("double")
        )
        return (
            scored.withColumn(prediction_col, classes)
            .withColumn(probability_col, array_to_vector(probabilities))
            .drop(scores_col)
        )


# --- estimators ---------------------------------------------------------------------------------


class NNEstimator(Estimator, NNEstimatorParams, _NNStage, MLReadable):
    """Train a bigdl_py model on a DataFrame with DistriOptimizer; ``fit`` returns an NNModel.

    The label column must match the model's output row by row: a numeric column for a
    model with one output per row (end the model with ``nn.Flatten(0)`` to turn ``(N, 1)``
    into ``(N,)``), or an array/Vector column for several outputs. For class labels use
    :class:`NNClassifier`.

    Parameters
    ----------
    model : bigdl_py.nn.Module
        Not changed by ``fit``: every fit trains a copy from the stage's weights.
    criterion : bigdl_py.nn Module
        The loss, e.g. ``nn.MSELoss()``.
    **params
        Any params by name.

    Params
    ------
    featuresCol ("features"), labelCol ("label"), predictionCol ("prediction", for the
    fitted model), batchSize (32, the global batch of one update), maxEpoch (10), endWhen
    (a Trigger, overrides maxEpoch), learningRate (1e-3), optimMethod (default
    ``SGD(lr=learningRate)``; an explicitly set learningRate replaces its lr),
    featureShape, numPartitions (default: task slots), seed (0), checkpointPath /
    checkpointTrigger / checkpointOverwrite, constantGradientClipping,
    gradientL2NormClipping, device (for the fitted model's transform).

    Notes
    -----
    ``setValidation``, ``setTrainSummary`` and ``setValidationSummary`` hold live objects
    (a DataFrame, summary writers): they apply to ``fit`` but are not params, so ``copy``
    shares them and ``save`` does not store them; so does ``setProgress``.

    A fit logs quietly, as a library call inside ``CrossValidator`` should: per-iteration
    progress at DEBUG (no bar), epoch summaries, validation results and early stopping at
    INFO on the ``bigdl_py.train`` logger. ``setProgress(True)`` gives the training loop's
    own display (a bar on a terminal, INFO lines otherwise).

    ``setEndWhen(MaxEpoch(50) | EarlyStopping("Loss", patience=3))`` with
    ``setValidation`` stops when validation stops improving, and the fitted model holds the
    best validation's weights.
    """

    def __init__(self, model: Module, criterion: Module, **params: Any):
        super().__init__()
        owner = type(self).__name__
        self.model = _check_module(model, "model", owner)
        self.criterion = _check_module(criterion, "criterion", owner)
        self._validation: tuple | None = None
        self._train_summary: TrainSummary | None = None
        self._validation_summary: ValidationSummary | None = None
        self._progress = False
        self._set_params(params)

    # --- persistence ------------------------------------------------------------------------
    def _saved_extras(self) -> dict:
        return {"criterion": module_config(self.criterion)}

    @classmethod
    def _from_saved(cls, model: Module, extras: dict) -> NNEstimator:
        return cls(model, module_from_config(extras["criterion"], "saved criterion"))

    # --- setters (each returns self) ----------------------------------------------------------
    def setFeaturesCol(self, value: str | list) -> NNEstimator:
        return self._set(featuresCol=value)

    def setLabelCol(self, value: str) -> NNEstimator:
        return self._set(labelCol=value)

    def setPredictionCol(self, value: str) -> NNEstimator:
        return self._set(predictionCol=value)

    def setBatchSize(self, value: int) -> NNEstimator:
        return self._set(batchSize=value)

    def setFeatureShape(self, value: list | tuple | None) -> NNEstimator:
        return self._set(featureShape=value)

    def setMaxEpoch(self, value: int) -> NNEstimator:
        return self._set(maxEpoch=value)

    def setEndWhen(self, trigger: Trigger) -> NNEstimator:
        """Stop when ``trigger`` fires (e.g. ``MaxIteration(500) | MinLoss(0.01)``)."""
        return self._set(endWhen=trigger)

    def setLearningRate(self, value: float) -> NNEstimator:
        return self._set(learningRate=value)

    def setOptimMethod(self, method: OptimMethod) -> NNEstimator:
        """The update rule; its config is stored and a fresh instance trains each fit."""
        return self._set(optimMethod=method)

    def setNumPartitions(self, value: int) -> NNEstimator:
        return self._set(numPartitions=value)

    def setSeed(self, value: int) -> NNEstimator:
        return self._set(seed=value)

    def setUpdateMode(self, value: Any) -> NNEstimator:
        """``"auto"`` (default), ``"sharded"``, ``"replicated"``, ``"local-sgd:PERIOD[:WARMUP]"``
        or a ``LocalSGD`` object: see ``DistriOptimizer(update=)``."""
        return self._set(updateMode=value)

    def setDevice(self, value: str) -> NNEstimator:
        return self._set(device=value)

    def setCheckpoint(
        self, path: str, trigger: Trigger | None = None, isOverWrite: bool = True
    ) -> NNEstimator:
        """Write checkpoints to directory ``path`` when ``trigger`` fires (default every epoch)."""
        trigger = EveryEpoch() if trigger is None else trigger
        return self._set(
            checkpointPath=path, checkpointTrigger=trigger, checkpointOverwrite=isOverWrite
        )

    def setConstantGradientClipping(self, min_value: float, max_value: float) -> NNEstimator:
        return self._set(constantGradientClipping=[min_value, max_value])

    def setGradientClippingByL2Norm(self, max_norm: float) -> NNEstimator:
        return self._set(gradientL2NormClipping=max_norm)

    def clearGradientClipping(self) -> NNEstimator:
        self.clear(self.constantGradientClipping)
        self.clear(self.gradientL2NormClipping)
        return self

    def setValidation(
        self,
        trigger: Trigger,
        val_df: DataFrame,
        val_method: ValidationMethod | list[ValidationMethod],
        batch_size: int | None = None,
    ) -> NNEstimator:
        """Evaluate ``val_method`` on ``val_df`` when ``trigger`` fires during ``fit``.

        ``val_df`` needs the columns this stage reads; inside a Pipeline that is the output
        of the stages before this one (``val_df`` does not pass through them).
        """
        check_trigger(trigger, "validation trigger", starts_validation=True)
        self._validation = (trigger, val_df, val_method, batch_size)
        return self

    def setProgress(self, value: bool = True) -> NNEstimator:
        """Show every iteration's progress during ``fit`` (default False: DEBUG lines only)."""
        self._progress = bool(value)
        return self

    def setTrainSummary(self, summary: TrainSummary | None) -> NNEstimator:
        self._train_summary = summary
        return self

    def setValidationSummary(self, summary: ValidationSummary | None) -> NNEstimator:
        self._validation_summary = summary
        return self

    # --- fit ---------------------------------------------------------------------------------
    def _label_column(self, df: DataFrame):
        """The label as it goes to the criterion (classifiers override: class indices)."""
        return df[self.getLabelCol()]

    def _training_columns(self, df: DataFrame) -> DataFrame:
        """Only the feature and label columns, the label in the criterion's form."""
        owner = type(self).__name__
        _require_columns(df, owner, featuresCol=self.getFeaturesCol(), labelCol=self.getLabelCol())
        features = list(dict.fromkeys(_column_names(self.getFeaturesCol())))
        label = self.getLabelCol()
        if label in features:
            raise ValueError(f"{owner}: labelCol {label!r} is also a feature column")
        return df.select(*features, self._label_column(df).alias(label))

    def _optim_method(self) -> OptimMethod:
        method = self.getOptimMethod()
        if method is None:
            return SGD(lr=self.getLearningRate())
        if self.isSet(self.learningRate):
            method = method.with_hyper_parameters(lr=self.getLearningRate())
        return method

    def _validation_arrays(self, val_df: DataFrame) -> tuple:
        """The validation DataFrame as ``(features, labels)`` arrays on the driver.

        Collected through Arrow (no Row objects) and evaluated on the driver: the training
        loop's ``set_validation`` does not yet take a Spark dataset with column settings.
        """
        from bigdl_py.spark.dataframe import dataframe_to_arrays

        return dataframe_to_arrays(
            self._training_columns(val_df),
            self.getFeaturesCol(),
            self.getLabelCol(),
            self.feature_shape(),
        )

    def _configure(self, optimizer: Any) -> None:
        """Everything besides the data, the model and the loss: BigDL's optimizer setters."""
        path = self.optional_param(self.checkpointPath)
        if path:
            trigger = self.optional_param(self.checkpointTrigger)
            optimizer.set_checkpoint(
                path,
                EveryEpoch() if trigger is None else trigger_from_config(trigger),
                self.getOrDefault(self.checkpointOverwrite),
            )
        clipping = self.optional_param(self.constantGradientClipping)
        if clipping is not None:
            optimizer.set_constant_gradient_clipping(*clipping)
        max_norm = self.optional_param(self.gradientL2NormClipping)
        if max_norm is not None:
            optimizer.set_gradient_clipping_by_l2_norm(max_norm)
        if self._validation is not None:
            trigger, val_df, methods, batch_size = self._validation
            optimizer.set_validation(trigger, self._validation_arrays(val_df), methods, batch_size)
        if self._train_summary is not None:
            optimizer.set_train_summary(self._train_summary)
        if self._validation_summary is not None:
            optimizer.set_validation_summary(self._validation_summary)

    def _fit(self, dataset: DataFrame) -> NNModel:
        from bigdl_py.spark.distri_optimizer import DistriOptimizer
        from bigdl_py.spark.modes import resolve_mode
        from bigdl_py.spark.session import (
            CONNECT_TRAINING_ALTERNATIVE,
            require_classic_spark,
            task_slots,
        )

        require_classic_spark(dataset, f"{type(self).__name__}.fit", CONNECT_TRAINING_ALTERNATIVE)
        training = self._training_columns(dataset)
        spark = dataset.sparkSession
        partitions = self.getNumPartitions()
        if partitions is None and self.getUpdateMode() != "auto":
            # A mode may train on a partition count of its own (a pipeline's stages).
            mode = resolve_mode(self.getUpdateMode())
            partitions = mode.check_training(self.model, self.getBatchSize(), None)
        partitions = partitions or task_slots(spark.sparkContext)
        # One shuffle of the selected columns gives every replica a non-empty, balanced share
        # whatever the DataFrame's own partitioning (filters and joins leave empty ones).
        training = training.repartition(partitions)
        end_trigger = self.getEndWhen() or MaxEpoch(self.getMaxEpoch())
        model = copy.deepcopy(self.model)
        optimizer = DistriOptimizer(
            model,
            training,
            copy.deepcopy(self.criterion),
            self._optim_method(),
            batch_size=self.getBatchSize(),
            end_trigger=end_trigger,
            num_partitions=partitions,
            feature_cols=self.getFeaturesCol(),
            label_col=self.getLabelCol(),
            feature_shape=self.feature_shape(),
            seed=self.getSeed(),
            update=self.getUpdateMode(),
            progress=True if self._progress else Progress(iteration_level=logging.DEBUG),
            spark=spark,
        )
        try:
            self._configure(optimizer)
            trained = optimizer.optimize()
        finally:
            optimizer.close()
        return self._copyValues(self._model_class()(trained))

    def _model_class(self) -> type[NNModel]:
        return NNModel


class NNClassifier(NNEstimator, HasProbabilityCol):
    """An NNEstimator for classification: labels are 0-based class indices.

    The label column may be any numeric type holding whole numbers (``StringIndexer``
    output is double); it is converted to integer class indices for the criterion.
    ``fit`` returns an :class:`NNClassifierModel`.

    Parameters
    ----------
    model : bigdl_py.nn.Module
        Outputs class scores ``(N, classes)``: logits, or log-probabilities after
        ``LogSoftmax``.
    criterion : Module, optional
        Default ``nn.CrossEntropyLoss()``, right for both logits and log-probabilities
        (log-softmax leaves log-probabilities unchanged).
    **params
        As for :class:`NNEstimator`, plus probabilityCol ("probability"; "" for none).
    """

    def __init__(self, model: Module, criterion: Module | None = None, **params: Any):
        super().__init__(model, CrossEntropyLoss() if criterion is None else criterion, **params)

    def setProbabilityCol(self, value: str) -> NNClassifier:
        return self._set(probabilityCol=value)

    def _label_column(self, df: DataFrame):
        return class_index_column(df, self.getLabelCol(), type(self).__name__)

    def _model_class(self) -> type[NNModel]:
        return NNClassifierModel
