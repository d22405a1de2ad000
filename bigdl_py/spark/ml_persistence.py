"""Save and load the ``NN*`` pipeline stages by Spark ML's conventions, without pickle.

A stage saved at ``path`` is two directories, both written through Spark::

    path/metadata/   Spark ML's metadata JSON (as DefaultParamsWriter writes it): class, uid,
                     params, default params, and a "bigdl_py" entry (format version; for an
                     estimator, its criterion as a module config).
    path/data/       Parquet, one row: the bigdl_py model as the bytes of a
                     ``bigdl_py.nn.save`` file (architecture JSON + .npy weights).

Why Parquet and not a file beside the metadata: a stage path is a Hadoop path (HDFS, S3, a
local directory, ...) that only Spark knows how to write; Spark ML's own models keep their
coefficients in ``data/`` Parquet the same way. Loading reads classes by name from the
stage classes and the ``bigdl_py.nn`` registry only, and never unpickles.
"""

from __future__ import annotations

import os
import tempfile
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.ml.util import DefaultParamsReader, DefaultParamsWriter, MLReader, MLWriter

from bigdl_py.nn import load as load_model
from bigdl_py.nn import save as save_model
from bigdl_py.nn.module import Module

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

FORMAT = "bigdl_py.spark.ml"
FORMAT_VERSION = 1
METADATA_KEY = "bigdl_py"
DATA_DIRECTORY = "data"
MODEL_COLUMN = "model"


def model_to_bytes(model: Module) -> bytes:
    """The bytes of a ``bigdl_py.nn.save`` file of ``model``."""
    with tempfile.TemporaryDirectory(prefix="bigdl_py-stage-") as directory:
        path = os.path.join(directory, "model.bigdl")
        save_model(model, path)
        with open(path, "rb") as file:
            return file.read()


def model_from_bytes(blob: bytes, source: str) -> Module:
    """Rebuild a model from :func:`model_to_bytes` output (``source`` names it in errors)."""
    with tempfile.TemporaryDirectory(prefix="bigdl_py-stage-") as directory:
        path = os.path.join(directory, "model.bigdl")
        with open(path, "wb") as file:
            file.write(blob)
        try:
            return load_model(path)
        except ValueError as error:
            raise ValueError(f"{source}: {error}".replace(path, "the stored model")) from None


def write_model_data(spark: SparkSession, model: Module, path: str) -> None:
    """Write ``model`` as the one-row Parquet ``path`` (through Arrow, no Row objects)."""
    table = pa.table({MODEL_COLUMN: pa.array([model_to_bytes(model)], type=pa.binary())})
    spark.createDataFrame(table).coalesce(1).write.parquet(path)


def read_model_data(spark: SparkSession, path: str) -> Module:
    """Read back what :func:`write_model_data` wrote."""
    table = spark.read.parquet(path).toArrow()
    if MODEL_COLUMN not in table.column_names or table.num_rows != 1:
        raise ValueError(
            f"{path} does not hold a saved bigdl_py model (expected one row with a "
            f"{MODEL_COLUMN!r} column, found {table.num_rows} rows, columns {table.column_names})"
        )
    return model_from_bytes(table.column(MODEL_COLUMN)[0].as_py(), path)


class NNStageWriter(MLWriter):
    """Writes a stage that has a ``model`` attribute and describes its other state as JSON.

    The stage provides ``_saved_extras() -> dict`` (JSON values stored in the metadata).
    """

    def __init__(self, instance: Any):
        super().__init__()
        self.instance = instance

    def saveImpl(self, path: str) -> None:
        extras = {"format": FORMAT, "version": FORMAT_VERSION, **self.instance._saved_extras()}
        DefaultParamsWriter.saveMetadata(
            self.instance, path, self.sparkSession, extraMetadata={METADATA_KEY: extras}
        )
        write_model_data(self.sparkSession, self.instance.model, os.path.join(path, DATA_DIRECTORY))


def _stage_classes(base: type) -> dict[str, type]:
    """``base`` and its subclasses, by the class name Spark ML writes in the metadata."""
    classes, pending = {}, [base]
    while pending:
        cls = pending.pop()
        classes[f"{cls.__module__}.{cls.__name__}"] = cls
        pending.extend(cls.__subclasses__())
    return classes


class NNStageReader(MLReader):
    """Reads a stage of class ``cls`` (or a subclass) written by :class:`NNStageWriter`.

    The class provides ``_from_saved(model, extras)``, building an instance from the model
    and the JSON extras; the params are then set from the metadata.
    """

    def __init__(self, cls: type):
        super().__init__()
        self.cls = cls

    def load(self, path: str) -> Any:
        metadata = DefaultParamsReader.loadMetadata(path, self.sparkSession)
        classes = _stage_classes(self.cls)
        stage_class = classes.get(metadata["class"])
        if stage_class is None:
            raise ValueError(
                f"{path} holds a {metadata['class']}, which {self.cls.__name__}.load cannot read "
                f"(it reads {sorted(classes)})"
            )
        extras = metadata.get(METADATA_KEY, {})
        if extras.get("format") != FORMAT:
            raise ValueError(f"{path} was not written by bigdl_py's Spark ML stages")
        if extras.get("version", 0) > FORMAT_VERSION:
            raise ValueError(
                f"{path} was written by a newer bigdl_py (stage format version "
                f"{extras['version']}; this one reads up to {FORMAT_VERSION})"
            )
        model = read_model_data(self.sparkSession, os.path.join(path, DATA_DIRECTORY))
        instance = stage_class._from_saved(model, extras)
        instance._resetUid(metadata["uid"])
        DefaultParamsReader.getAndSetParams(instance, metadata)
        return instance
