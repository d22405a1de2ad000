"""Evaluate a saved bigdl_py model on Spark: Top1Accuracy and Loss, over Parquet data or the
Fashion-MNIST test set.

    python jobs/evaluate.py lenet.bigdl
    python jobs/evaluate.py model.bigdl --input data.parquet --feature-shape 1,28,28
    spark-submit --master spark://host:7077 jobs/evaluate.py lenet.bigdl --output-json m.json

The model is broadcast once; each partition computes partial sums that the driver merges
(``bigdl_py.spark.inference.evaluate``), so the result equals one pass over all the data.
"""

from __future__ import annotations

import argparse
import json
import os
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

CRITERIA = ("cross_entropy", "nll")


def parse_arguments(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_data_arguments(parser)
    parser.add_argument(
        "--criterion",
        choices=CRITERIA,
        default="cross_entropy",
        help="loss for the Loss metric: cross_entropy (right for logits and for LogSoftmax "
        "outputs; default) or nll (log-probabilities)",
    )
    parser.add_argument("--output-json", default=None, help="also write the metrics here")
    return parser.parse_args(argv)


def check_locations(args: argparse.Namespace) -> None:
    """Exit naming the problem when --output-json could not be written or would replace the
    model or the data (or lie inside them); before the model is read or Spark starts."""
    if args.output_json is None:
        return
    if output_checks.local_path(args.output_json) is None:
        raise SystemExit(
            f"--output-json {args.output_json!r} is not a local path: the driver writes it "
            "with Python's file functions"
        )
    problem = output_checks.locations_problem(
        [("--output-json", args.output_json)], input_locations(args)
    ) or output_checks.output_file_problem(args.output_json, "--output-json")
    if problem:
        raise SystemExit(problem)


def write_json(path: str, payload: dict) -> None:
    """Write ``payload`` atomically, making the missing folders; should that still fail (a
    full disk, a folder made read-only meanwhile), print the metrics before exiting so that
    the evaluation's result is not lost."""
    from bigdl_py.nn.serialization import atomic_write

    text = json.dumps(payload, indent=2)
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        atomic_write(os.path.abspath(path), lambda file: file.write(text.encode("utf-8")))
    except OSError as error:
        print(text)
        raise SystemExit(
            f"--output-json {path!r} could not be written ({error}); the metrics are printed above"
        ) from None


def main(argv=None) -> dict:
    args = parse_arguments(argv)
    import bigdl_py.nn as nn
    from bigdl_py.spark.inference import evaluate
    from bigdl_py.spark.ml import class_index_column
    from bigdl_py.train import Loss, Top1Accuracy

    check_locations(args)
    check_input_location(args)
    model = load_model(args.model)
    spark = start_spark(args, "bigdl_py evaluate")
    data = InputData(spark, args, needs_labels=True)
    df = data.df.withColumn(
        data.label_col, class_index_column(data.df, data.label_col, "evaluate.py")
    )
    criterion = nn.CrossEntropyLoss() if args.criterion == "cross_entropy" else nn.NLLLoss()
    log(f"Evaluating {args.model} on {data.description} ({df.rdd.getNumPartitions()} partitions)")
    started = time.perf_counter()
    results = evaluate(
        model,
        df,
        [Top1Accuracy(), Loss(criterion)],
        batch_size=args.batch_size,
        feature_cols=data.feature_cols,
        label_col=data.label_col,
        feature_shape=data.feature_shape,
        device=args.device,
    )
    seconds = time.perf_counter() - started
    rows = results[0].count
    print(f"Evaluated {rows} rows in {seconds:.1f} s ({rows / seconds:.0f} rows/s)")
    for result in results:
        print(f"  {result!r}")
    metrics = {
        "model": args.model,
        "data": data.description,
        "rows": rows,
        "seconds": seconds,
        "results": {result.name: result.to_dict() for result in results},
    }
    if args.output_json:
        write_json(args.output_json, metrics)
        print(f"Metrics written to {args.output_json}")
    return metrics


if __name__ == "__main__":
    try:
        main()
    finally:
        stop_spark()
