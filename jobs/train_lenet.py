"""Train LeNet-5 on Fashion-MNIST with DistriOptimizer: bigdl_py's main job.

Runs with plain Python (Spark local mode, ``local[*]``) or with spark-submit:

    python jobs/train_lenet.py
    python jobs/train_lenet.py --epochs 3 --optimizer adam --lr 0.001
    python jobs/train_lenet.py --update pipeline --stages 2 --micro-batches 4
    spark-submit --master spark://host:7077 --properties-file conf/spark-defaults.conf \\
        --py-files dist/bigdl_py.zip jobs/train_lenet.py --partitions 4

It prints progress (a bar on a terminal, log lines otherwise) and the test accuracy after
every epoch, and writes into ``--output`` (default ``runs/lenet``): the trained model
(``lenet.bigdl``, bigdl_py's safe format), TensorBoard summaries (``summaries/``), and the
loss/accuracy curves (``curves.png``). ``--checkpoint-dir`` keeps a checkpoint per epoch and
``--resume`` continues from the newest one there. The output folder appears only when the run
completes; an existing one is replaced only with ``--overwrite`` (or continued with
``--resume``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

# Runnable from a source checkout without installing (spark-submit puts only jobs/ on the path).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import output_checks  # noqa: E402
from argument_types import real_number, whole_number  # noqa: E402
from training_arguments import (  # noqa: E402
    add_training_arguments,
    check_training_arguments,
    default_if_none,
    log_to_console,
    run_output,
)

from bigdl_py import nn  # noqa: E402
from bigdl_py.data import fashion_mnist  # noqa: E402
from bigdl_py.models import lenet5  # noqa: E402
from bigdl_py.optim import SGD, Adam  # noqa: E402
from bigdl_py.spark import LocalSGD, Pipeline  # noqa: E402
from bigdl_py.spark.distri_optimizer import DistriOptimizer  # noqa: E402
from bigdl_py.spark.session import get_spark, task_slots  # noqa: E402
from bigdl_py.spark.settings import MAX_ITERATIONS_PER_JOB  # noqa: E402
from bigdl_py.train import (  # noqa: E402
    EveryEpoch,
    Loss,
    MaxEpoch,
    Top1Accuracy,
    TrainSummary,
    ValidationSummary,
    evaluate_batches,
    plot_curves,
    validation_batches,
)
from bigdl_py.train.batches import as_array_dataset  # noqa: E402
from bigdl_py.train.progress import Progress  # noqa: E402

# What the job writes into --output; an existing --output holding anything else is refused.
WRITES = ("lenet.bigdl", "curves.png", "summaries")


def parse_arguments(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_training_arguments(parser, epochs=4, output="runs/lenet")
    parser.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd")
    parser.add_argument(
        "--lr",
        type=real_number(0),
        default=None,
        help="learning rate (default: 0.05 for sgd, 0.001 for adam)",
    )
    parser.add_argument("--momentum", type=real_number(0), default=0.9, help="SGD momentum")
    parser.add_argument(
        "--summary-dir",
        default=None,
        help="TensorBoard summaries, outside --output (default: <output>/summaries)",
    )
    parser.add_argument(
        "--wire-dtype",
        choices=("float32", "float16", "bfloat16"),
        default="float32",
        help="precision of gradient slices in the shuffle",
    )
    parser.add_argument(
        "--update",
        choices=("auto", "sharded", "replicated", "local-sgd", "one-task", "pipeline"),
        default="auto",
        help="auto (default): one-task in local mode; on a cluster replicated with 16 "
        "iterations per job for small models, else sharded (docs/deploy.md); one-task: "
        "the partitions train at once in one Spark task, 128 or more iterations per job; "
        "sharded: "
        "BigDL's AllReduce, each partition steps its slice (two stages per iteration); "
        "replicated: every partition steps the whole vector "
        "(one stage per iteration); local-sgd: each partition trains its own replica for "
        "--period iterations, then the replicas are averaged (not exact); pipeline: the "
        "model cut into --stages stages, one a partition, each batch in --micro-batches "
        "micro-batches (GPipe's schedule, exact)",
    )
    parser.add_argument(
        "--stages",
        type=whole_number(1),
        default=2,
        help="with --update pipeline: stages the model is cut into (default 2)",
    )
    parser.add_argument(
        "--micro-batches",
        type=whole_number(1),
        default=4,
        help="with --update pipeline: micro-batches of each batch (default 4); with "
        "--replicas they must divide --batch-size",
    )
    parser.add_argument(
        "--replicas",
        type=whole_number(1),
        default=1,
        help="with --update pipeline: pipelines side by side (default 1); the partitions "
        "are stages x replicas",
    )
    parser.add_argument(
        "--recompute",
        action="store_true",
        help="with --update pipeline: keep only each stage's inputs and recompute its "
        "forward in the backward (less memory, the same results)",
    )
    parser.add_argument(
        "--period",
        type=whole_number(1),
        default=8,
        help="with --update local-sgd: iterations between two averagings (default 8)",
    )
    parser.add_argument(
        "--iterations-per-job",
        type=whole_number(1, MAX_ITERATIONS_PER_JOB),
        default=None,
        help="iterations chained into one Spark job, 1 to 32 (default: as --update auto "
        "picks them, else 8 where the executors share a disk, and 1 otherwise)",
    )
    parser.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar, one loss line per epoch (each epoch's test accuracy is still shown)",
    )
    arguments = parser.parse_args(argv)
    return check_training_arguments(
        parser,
        arguments,
        writes=WRITES,
        kind=output_checks.OPTIMIZER_RUN,
        fashion_mnist=("train", "test"),
        more_outputs=(("--summary-dir", arguments.summary_dir),),
    )


def progress_reporting(no_progress: bool) -> Progress:
    """--no-progress hides the bar and the lines within an epoch, not the epochs' results."""
    if no_progress:
        return Progress(True, bar=False, log_interval=10**9)
    return Progress(True)


def main(argv=None) -> float:
    arguments = parse_arguments(argv)
    log_to_console()
    started = time.perf_counter()
    spark = get_spark(arguments.master, app_name="bigdl_py LeNet-5 Fashion-MNIST")
    spark.sparkContext.setLogLevel("WARN")
    with run_output(arguments) as output:
        accuracy, state = train(arguments, spark, output)
    minutes = (time.perf_counter() - started) / 60
    print(
        f"final test accuracy: {accuracy * 100:.2f}% after {state.epoch} epochs "
        f"({state.iteration} iterations) in {minutes:.1f} min",
        flush=True,
    )
    summary_dir = arguments.summary_dir or os.path.join(arguments.output, "summaries")
    model_path = os.path.join(arguments.output, "lenet.bigdl")
    curves = os.path.join(arguments.output, "curves.png")
    print(f"model: {model_path}\ncurves: {curves}\nsummaries: {summary_dir}", flush=True)
    spark.stop()
    return accuracy


def training_mode(arguments: argparse.Namespace):
    """``DistriOptimizer(update=)`` for the command line: a name, or a mode object."""
    if arguments.update == "local-sgd":
        return LocalSGD(period=arguments.period)
    if arguments.update == "pipeline":
        return Pipeline(
            stages=arguments.stages,
            micro_batches=arguments.micro_batches,
            replicas=arguments.replicas,
            recompute=arguments.recompute,
        )
    return arguments.update


def train(arguments: argparse.Namespace, spark, output: str):
    """Train LeNet-5 and test it; the model, the curves and (unless --summary-dir is given)
    the summaries go into the folder ``output``. Returns the test accuracy and the
    optimizer's final state."""
    train_features, train_labels = fashion_mnist("train", arguments.data)
    test_features, test_labels = fashion_mnist("test", arguments.data)
    if arguments.limit is not None:
        train_features = train_features[: arguments.limit]
        train_labels = train_labels[: arguments.limit]
    update = training_mode(arguments)
    partitions = arguments.partitions or task_slots(spark.sparkContext)
    if arguments.update == "pipeline" and arguments.partitions is None:
        partitions = update.partitions  # one a stage of each replica
    print(
        f"Fashion-MNIST: {len(train_labels)} training and {len(test_labels)} test images; "
        f"{partitions} partitions on {spark.sparkContext.master}",
        flush=True,
    )

    nn.init.manual_seed(arguments.seed)
    model = lenet5()
    if arguments.optimizer == "sgd":
        method = SGD(lr=default_if_none(arguments.lr, 0.05), momentum=arguments.momentum)
    else:
        method = Adam(lr=default_if_none(arguments.lr, 1e-3))
    optimizer = DistriOptimizer(
        model,
        (train_features, train_labels),
        nn.NLLLoss(),
        method,
        batch_size=arguments.batch_size,
        end_trigger=MaxEpoch(arguments.epochs),
        num_partitions=partitions,
        wire_dtype=arguments.wire_dtype,
        update=update,
        iterations_per_job=arguments.iterations_per_job,
        seed=arguments.seed,
        device=arguments.device,
        progress=progress_reporting(arguments.no_progress),
        spark=spark,
    )
    test_set = as_array_dataset((test_features, test_labels), "test set", shuffle=False)
    optimizer.set_validation(EveryEpoch(), test_set, [Top1Accuracy(), Loss()], batch_size=500)
    summary_dir = arguments.summary_dir or os.path.join(output, "summaries")
    optimizer.set_train_summary(TrainSummary(summary_dir, "lenet"))
    optimizer.set_validation_summary(ValidationSummary(summary_dir, "lenet"))
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

    results = evaluate_batches(trained, validation_batches(test_set, 500), [Top1Accuracy()])
    nn.save(trained, os.path.join(output, "lenet.bigdl"))
    plot_curves(
        os.path.join(summary_dir, "lenet"),
        os.path.join(output, "curves.png"),
        title="LeNet-5 on Fashion-MNIST (bigdl_py DistriOptimizer)",
    )
    return results[0].value, optimizer.state


if __name__ == "__main__":
    main()
