"""The command-line arguments every training job takes, defined once so the jobs agree.

``train_lenet.py``, ``train_gan.py`` and ``train_ncf.py`` add their own (optimizer, network
sizes, ...) after these, call :func:`check_training_arguments` on the result, and write their
output inside :func:`run_output`.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
from collections.abc import Iterator

import output_checks
from argument_types import whole_number
from staged_output import staged_folder

from bigdl_py.data import find_fashion_mnist


def add_training_arguments(
    parser: argparse.ArgumentParser, *, epochs: int, output: str, fashion_mnist: bool = True
) -> argparse.ArgumentParser:
    """Master, data (where the job reads Fashion-MNIST), epochs, global batch, partitions,
    device, seed, limit, output and checkpoints; ``epochs`` and ``output`` are the job's
    defaults."""
    parser.add_argument(
        "--master", default=None, help="Spark master (default: spark-submit's, else local[*])"
    )
    if fashion_mnist:
        parser.add_argument(
            "--data",
            default=None,
            help="directory of the Fashion-MNIST IDX files "
            "(default: $BIGDL_PY_DATA, then /usr/share/datasets/fashion-mnist)",
        )
    parser.add_argument("--epochs", type=whole_number(1), default=epochs)
    parser.add_argument("--batch-size", type=whole_number(1), default=128, help="global batch size")
    parser.add_argument(
        "--partitions",
        type=whole_number(1),
        default=None,
        help="data partitions = model replicas (default: the task slots)",
    )
    parser.add_argument(
        "--device",
        choices=("cpu", "gpu", "auto"),
        default="cpu",
        help="run the replicas on CPU, on the executors' GPUs, or on GPUs where there are some",
    )
    # numpy's generators refuse negative seeds.
    parser.add_argument("--seed", type=whole_number(0), default=0)
    # 0 would mean "everything" and -5 "all but 5" through slicing.
    parser.add_argument(
        "--limit",
        type=whole_number(1),
        default=None,
        help="train on the first N samples only (smoke tests)",
    )
    parser.add_argument(
        "--output",
        default=output,
        help=f"folder of the model and pictures (default {output}); written as "
        ".<name>.partial beside it until the run completes",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing --output of an earlier run, once this run's output is "
        "complete (--resume continues its run's --output without it)",
    )
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
    writes: tuple[str, ...],
    kind: str | None = None,
    fashion_mnist: tuple[str, ...] = (),
    more_outputs: tuple[tuple[str, str | None], ...] = (),
) -> argparse.Namespace:
    """Exit with a usage error for settings that cannot work together or cannot work at all.

    Runs before Spark starts and before any data is read: the Fashion-MNIST ``splits`` the
    job reads, then the output and checkpoint locations. No output (``--output``,
    ``--checkpoint-dir``, ``more_outputs``) may be, hold or lie inside an input (the data,
    the checkpoints of a resumed run) or another output; an existing ``--output`` may hold
    only what the job writes (``writes``: file name patterns) and is replaced only with
    ``--overwrite`` or ``--resume``. ``kind`` names the run kind whose checkpoints this job
    writes (see ``output_checks``).
    """
    if arguments.resume and not arguments.checkpoint_dir:
        parser.error("--resume needs --checkpoint-dir")
    if arguments.partitions is not None and arguments.batch_size < arguments.partitions:
        parser.error(
            f"--batch-size {arguments.batch_size} is smaller than --partitions "
            f"{arguments.partitions}: every partition needs a sample of each batch"
        )
    inputs = []
    data = getattr(arguments, "data", None)  # jobs that read no Fashion-MNIST have no --data
    data_option = "--data" if data else "the Fashion-MNIST folder"
    for split in fashion_mnist:
        try:
            inputs.append((data_option, find_fashion_mnist(split, data)))
        except FileNotFoundError as error:
            parser.error(f"--data: {error}")
    if arguments.resume:
        inputs.append(("--checkpoint-dir", arguments.checkpoint_dir))
    outputs = [
        ("--output", arguments.output),
        ("--checkpoint-dir", arguments.checkpoint_dir),
        *more_outputs,
    ]
    for option, path in outputs:
        if path is not None and output_checks.local_path(path) is None:
            parser.error(
                f"{option} {path!r} is not a local path: the driver writes it with Python's "
                "file functions (on a cluster, a shared file system mounted on the driver)"
            )
    problem = (
        output_checks.locations_problem(outputs, inputs)
        or output_checks.output_directory_problem(arguments.output)
        or output_checks.existing_output_problem(
            arguments.output,
            "--output",
            overwrite=arguments.overwrite or arguments.resume,
            own_entry=output_checks.named_entries(*writes),
        )
        or (
            kind
            and output_checks.checkpoint_directory_problem(
                arguments.checkpoint_dir,
                arguments.resume,
                arguments.overwrite_checkpoints,
                kind,
            )
        )
    )
    if problem:
        parser.error(problem)
    return arguments


@contextlib.contextmanager
def run_output(arguments: argparse.Namespace) -> Iterator[str]:
    """The folder a training run writes its ``--output`` into (see ``staged_output``).

    A run that keeps checkpoints keeps its partial output when it fails, so that
    ``--resume`` continues it (the sample grids and summaries of the epochs before).
    """
    with staged_folder(
        arguments.output,
        continue_run=arguments.resume,
        keep_on_failure=bool(arguments.checkpoint_dir),
    ) as folder:
        print(f"writing into {folder} until the run completes", flush=True)
        yield folder
    print(f"output: {arguments.output}", flush=True)


def log_to_console() -> None:
    """The jobs' log: bigdl_py's INFO lines (the mode chosen, progress) on the console,
    without py4j's, which are Spark's plumbing."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)


def default_if_none(value, default):
    """``value`` unless it was not given: zero is a value (``--lr 0`` is not the default)."""
    return default if value is None else value
