"""The command-line arguments every training job takes, defined once so the jobs agree.

``train_lenet.py`` and ``train_gan.py`` add their own (optimizer, network sizes, ...) after
these and call :func:`check_training_arguments` on the result.
"""

from __future__ import annotations

import argparse


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
    return parser


def check_training_arguments(
    parser: argparse.ArgumentParser, arguments: argparse.Namespace
) -> argparse.Namespace:
    """Exit with a usage error for settings that cannot work together."""
    if arguments.resume and not arguments.checkpoint_dir:
        parser.error("--resume needs --checkpoint-dir")
    if arguments.epochs < 1 or arguments.batch_size < 1:
        parser.error("--epochs and --batch-size must be positive")
    if arguments.partitions is not None and arguments.partitions < 1:
        parser.error("--partitions must be positive")
    return arguments
