"""What ``evaluate.py`` and ``predict.py`` share: their data arguments, the Spark session and
the input DataFrame (a Parquet path, or the Fashion-MNIST test set by default)."""

from __future__ import annotations

import argparse
import os
import sys
import time

# Runnable from a source checkout without installing (spark-submit puts only jobs/ on the path).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from argument_types import (  # noqa: E402
    column_names,
    device_request,
    positive_integers,
    whole_number,
)

DEFAULT_BATCH_SIZE = 512


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments both jobs take: where the model and the data are, and how to run."""
    parser.add_argument("model", help="a model saved with bigdl_py.nn.save (e.g. lenet.bigdl)")
    parser.add_argument(
        "--master",
        default=None,
        help="Spark master URL (default: spark-submit's --master, else local[*])",
    )
    parser.add_argument(
        "--input",
        default=None,
        help="a Parquet file or directory (default: the Fashion-MNIST test set)",
    )
    parser.add_argument(
        "--data",
        default=None,
        help="Fashion-MNIST directory when --input is not given (default: $BIGDL_PY_DATA or "
        "/usr/share/datasets/fashion-mnist)",
    )
    parser.add_argument(
        "--features-col",
        type=column_names,
        default="features",
        help="feature column(s), comma-separated (default: features)",
    )
    parser.add_argument("--label-col", default="label", help="label column (default: label)")
    parser.add_argument(
        "--feature-shape",
        type=positive_integers,
        default=None,
        help="per-row feature shape, e.g. 1,28,28 (default: the column's own; 1,28,28 for "
        "Fashion-MNIST)",
    )
    parser.add_argument(
        "--batch-size",
        type=whole_number(1),
        default=DEFAULT_BATCH_SIZE,
        help=f"rows per forward pass on an executor (default {DEFAULT_BATCH_SIZE})",
    )
    parser.add_argument(
        "--partitions",
        type=whole_number(1),
        default=None,
        help="partitions of the input DataFrame (default: the Parquet files' own split; the "
        "cluster's task slots for Fashion-MNIST)",
    )
    parser.add_argument(
        "--device", type=device_request, default="cpu", help="cpu, auto, gpu or cuda:<n>"
    )


def input_locations(args: argparse.Namespace) -> list[tuple[str, str | None]]:
    """The run's inputs as ``(option, path)``: the model, and the Parquet data or the
    Fashion-MNIST folder (the default one only where it is found)."""
    if args.input is not None:
        return [("the model", args.model), ("--input", args.input)]
    if args.data is not None:
        return [("the model", args.model), ("--data", args.data)]
    from bigdl_py.data import find_fashion_mnist

    try:
        folder = find_fashion_mnist("test")
    except FileNotFoundError:
        folder = None
    return [("the model", args.model), ("the Fashion-MNIST folder", folder)]


def check_input_location(args: argparse.Namespace) -> None:
    """Exit naming a missing --input or Fashion-MNIST directory before Spark starts."""
    if args.input is None:
        from bigdl_py.data import find_fashion_mnist

        try:
            find_fashion_mnist("test", args.data)
        except FileNotFoundError as error:
            raise SystemExit(f"--data: {error}") from None
    elif "://" not in args.input and not os.path.exists(args.input.removeprefix("file:")):
        raise SystemExit(f"--input {args.input!r} does not exist")


def start_spark(args: argparse.Namespace, app_name: str):
    from bigdl_py.spark.session import get_spark

    started = time.perf_counter()
    spark = get_spark(args.master, app_name=app_name)
    spark.sparkContext.setLogLevel("WARN")
    log(
        f"Spark {spark.version}, master {spark.sparkContext.master} "
        f"({time.perf_counter() - started:.1f} s to start)"
    )
    return spark


def load_model(path: str):
    import bigdl_py.nn as nn

    if not os.path.isfile(path):
        raise SystemExit(f"no model file at {path!r}")
    return nn.load(path)


class InputData:
    """The input DataFrame and how to read it: ``df``, ``feature_cols``, ``label_col``,
    ``feature_shape`` and a ``description`` for the console."""

    def __init__(self, spark, args: argparse.Namespace, needs_labels: bool):
        self.label_col = args.label_col
        if args.input is None:
            self._fashion_mnist_test_set(spark, args)
        else:
            self._parquet(spark, args, needs_labels)

    def _fashion_mnist_test_set(self, spark, args) -> None:
        import numpy as np

        from bigdl_py.data import fashion_mnist
        from bigdl_py.spark.dataframe import arrays_to_dataframe
        from bigdl_py.spark.session import task_slots

        try:
            images, labels = fashion_mnist("test", args.data)
        except FileNotFoundError as error:
            raise SystemExit(str(error)) from None
        partitions = task_slots(spark.sparkContext) if args.partitions is None else args.partitions
        # The image's position in the test set travels as its own column, so predictions
        # written to Parquet can be matched to images whatever order they are read in.
        index = np.arange(len(labels), dtype=np.int64)
        self.df = arrays_to_dataframe(
            spark,
            [index, images],
            labels,
            feature_cols=["index", "features"],
            label_col=self.label_col,
            num_partitions=partitions,
        )
        self.feature_cols = "features"
        self.feature_shape = args.feature_shape or images.shape[1:]
        self.description = f"the Fashion-MNIST test set ({len(labels)} images)"

    def _parquet(self, spark, args, needs_labels: bool) -> None:
        self.df = spark.read.parquet(args.input)
        if args.partitions is not None:
            self.df = self.df.repartition(args.partitions)
        self.feature_cols = args.features_col
        self.feature_shape = args.feature_shape
        names = [self.feature_cols] if isinstance(self.feature_cols, str) else self.feature_cols
        if needs_labels:
            names = [*names, self.label_col]
        missing = [name for name in names if name not in self.df.columns]
        if missing:
            raise SystemExit(
                f"{args.input} has no column(s) {missing}; its columns are {self.df.columns} "
                "(see --features-col / --label-col)"
            )
        self.description = args.input

    @property
    def feature_names(self) -> list[str]:
        return [self.feature_cols] if isinstance(self.feature_cols, str) else self.feature_cols


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def stop_spark() -> None:
    """Stop the session a job started (at exit, also after an error)."""
    from pyspark.sql import SparkSession

    session = SparkSession.getActiveSession()
    if session is not None:
        session.stop()
