"""The command-line arguments every training job takes, defined once so the jobs agree.

``train_lenet.py`` and ``train_gan.py`` add their own (optimizer, network sizes, ...) after
these and call :func:`check_training_arguments` on the result.
"""

from __future__ import annotations

import argparse

import output_checks

from bigdl_py.data import find_fashion_mnist


def add_training_arguments(
    parser: argparse.ArgumentParser, *, epochs: int, output: str
) -> argparse.ArgumentParser:
    """Master, data, epochs, global batch, partitions, device, seed, limit, output and
    checkpoints; ``epochs`` and ``output`` are the job's defaults."""
    parser.add_argument(
        "--master", default=None, help="Spark master (default: spark-submit's, else local[*])"
    )
    parser.add_argument(
        "--data",
        default=None,
        help="directory of the Fashion-MNIST IDX files "
        "(default: $BIGDL_PY_DATA, then /usr/share/datasets/fashion-mnist)",
    )
    parser.add_argument("--epochs", type=int, default=epochs)
    parser.add_argument("--batch-size", type=int, default=128, help="global batch size")
    parser.add_argument(
        "--partitions",
        type=int,
        default=None,
        help="data partitions = model replicas (default: the task slots)",
    )
    parser.add_argument(
        "--device",
        choices=("cpu", "gpu", "auto"),
        default="cpu",
        help="run the replicas on CPU, on the executors' GPUs, or on GPUs where there are some",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--limit", type=int, default=None, help="train on the first N samples only (smoke tests)"
    )
    parser.add_argument("--output", default=output, help="where the model and pictures go")
    parser.add_argument("--checkpoint-dir", default=None, help="keep a checkpoint every epoch")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue from the newest checkpoint in --checkpoint-dir",
    )
    parser.add_argument(
        "--overwrite-checkpoints",
        action="store_true",
        help="let a new run replace the checkpoints another run left in --checkpoint-dir",
    )
    return parser


def check_training_arguments(
    parser: argparse.ArgumentParser,
    arguments: argparse.Namespace,
    *,
    kind: str | None = None,
    fashion_mnist: tuple[str, ...] = (),
) -> argparse.Namespace:
    """Exit with a usage error for settings that cannot work together or cannot work at all.

    Runs before Spark starts and before any data is read: the output and checkpoint
    locations (``kind`` names the run kind whose checkpoints this job writes, see
    ``output_checks``), and the Fashion-MNIST ``splits`` the job reads.
    """
    if arguments.resume and not arguments.checkpoint_dir:
        parser.error("--resume needs --checkpoint-dir")
    if arguments.epochs < 1 or arguments.batch_size < 1:
        parser.error("--epochs and --batch-size must be positive")
    if arguments.partitions is not None and arguments.partitions < 1:
        parser.error("--partitions must be positive")
    if arguments.limit is not None and arguments.limit < 1:
        # 0 would mean "everything" and -5 "all but 5" through slicing.
        parser.error(f"--limit must be a positive number of samples, got {arguments.limit}")
    if arguments.partitions is not None and arguments.batch_size < arguments.partitions:
        parser.error(
            f"--batch-size {arguments.batch_size} is smaller than --partitions "
            f"{arguments.partitions}: every partition needs a sample of each batch"
        )
    problem = output_checks.output_directory_problem(arguments.output) or (
        kind
        and output_checks.checkpoint_directory_problem(
            arguments.checkpoint_dir, arguments.resume, arguments.overwrite_checkpoints, kind
        )
    )
    if problem:
        parser.error(problem)
    for split in fashion_mnist:
        try:
            find_fashion_mnist(split, arguments.data)
        except FileNotFoundError as error:
            parser.error(f"--data: {error}")
    return arguments


def default_if_none(value, default):
    """``value`` unless it was not given: zero is a value (``--lr 0`` is not the default)."""
    return default if value is None else value
