"""Predict with a saved bigdl_py model on Spark, over Parquet data or the Fashion-MNIST test
set, and write the predictions to Parquet.

    python jobs/predict.py lenet.bigdl --output predictions.parquet
    python jobs/predict.py model.bigdl --input data.parquet --feature-shape 1,28,28 \\
        --prediction probabilities --output out.parquet
    spark-submit --master spark://host:7077 jobs/predict.py lenet.bigdl --output out.parquet

Every input column but the features is written next to the prediction (the Fashion-MNIST
test set has ``index`` and ``label``), so rows can be matched whatever order Parquet is read
back in. The model is broadcast once and each partition is batched in order
(``bigdl_py.spark.inference.predict``).
"""

from __future__ import annotations

import argparse
import time

import output_checks
from inference_inputs import (
    InputData,
    add_data_arguments,
    check_input_location,
    input_locations,
    load_model,
    log,
    start_spark,
    stop_spark,
)
from staged_output import write_parquet

OUTPUTS = ("class", "probabilities", "raw")


def parse_arguments(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_data_arguments(parser)
    parser.add_argument("--output", required=True, help="Parquet directory to write")
    parser.add_argument(
        "--prediction",
        choices=OUTPUTS,
        default="class",
        help="class: the most probable class index (double, as Spark ML); probabilities: "
        "array<float> of class probabilities; raw: the model's output (default: class)",
    )
    parser.add_argument("--prediction-col", default="prediction")
    parser.add_argument(
        "--keep-features", action="store_true", help="write the feature columns too"
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing --output (once the new predictions are all written)",
    )
    parser.add_argument(
        "--nan-rows",
        choices=("error", "null"),
        default="error",
        help="rows whose features hold NaN or Inf: fail naming the row (default), or write a "
        "null prediction for them",
    )
    return parser.parse_args(argv)


def check_locations(args: argparse.Namespace) -> None:
    """Exit naming the problem when the output could not be written or would destroy data:
    an --output that is, holds or lies inside the model or the data, one that exists
    (without --overwrite) or holds anything but a Parquet dataset, one that cannot be made.

    Run before the model is loaded or Spark starts, so a mistake costs a second.
    """
    problem = (
        output_checks.locations_problem([("--output", args.output)], input_locations(args))
        or output_checks.output_directory_problem(args.output)
        or output_checks.existing_output_problem(
            args.output,
            "--output",
            overwrite=args.overwrite,
            own_entry=output_checks.parquet_entry,
        )
    )
    if problem is not None:
        raise SystemExit(problem)


def main(argv=None) -> dict:
    args = parse_arguments(argv)
    from pyspark.sql import functions as F

    from bigdl_py.spark.inference import predict

    check_locations(args)
    check_input_location(args)
    model = load_model(args.model)
    spark = start_spark(args, "bigdl_py predict")
    data = InputData(spark, args, needs_labels=False)
    log(f"Predicting with {args.model} on {data.description}")
    scored = predict(
        model,
        data.df,
        batch_size=args.batch_size,
        feature_cols=data.feature_cols,
        prediction_col=args.prediction_col,
        output=args.prediction,
        device=args.device,
        feature_shape=data.feature_shape,
        nonfinite=args.nan_rows,
    )
    if not args.keep_features:
        scored = scored.drop(*data.feature_names)
    started = time.perf_counter()
    write_parquet(scored, args.output, args.overwrite)
    seconds = time.perf_counter() - started
    written = spark.read.parquet(args.output)
    rows = written.count()
    rate = rows / seconds
    print(f"Wrote {rows} predictions to {args.output} in {seconds:.1f} s ({rate:.0f} rows/s)")
    print(f"Columns: {', '.join(f'{name} {kind}' for name, kind in written.dtypes)}")
    summary = {"rows": rows, "seconds": seconds, "output": args.output}
    if args.prediction == "class":
        counts = written.groupBy(args.prediction_col).count().orderBy(args.prediction_col)
        # --nan-rows null leaves rows without a class: counted apart, not as a class.
        histogram, unpredicted = {}, 0
        for value, count in counts.collect():
            if value is None:
                unpredicted = int(count)
            else:
                histogram[int(value)] = int(count)
        print("Predicted classes: " + ", ".join(f"{k}: {v}" for k, v in histogram.items()))
        summary["classes"] = histogram
        if unpredicted:
            print(f"Rows without a prediction (NaN or Inf features): {unpredicted}")
            summary["null_predictions"] = unpredicted
        if data.label_col in written.columns and rows > unpredicted:
            correct = written.where(F.col(args.prediction_col) == F.col(data.label_col)).count()
            agreement = correct / (rows - unpredicted)
            print(f"Agreement with column {data.label_col!r}: {agreement:.4f}")
            summary["agreement"] = agreement
    return summary


if __name__ == "__main__":
    try:
        main()
    finally:
        stop_spark()
