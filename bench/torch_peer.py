"""PyTorch DDP under Spark's own TorchDistributor: the yardstick the distributed benches use.

``pyspark.ml.torch.distributor.TorchDistributor`` is what a Spark user would otherwise pick to
train data-parallel, so ``bench/time_to_accuracy.py`` (LeNet-5 to a target accuracy) and
``bench/distributed.py resnet`` (ResNet-18's samples/s) set bigdl_py beside it, run the same
way: ``local_mode=True`` on this machine's CPUs, P processes x 1 thread each (as bigdl_py's
tasks use one BLAS thread each), gloo between them.

The driver calls :func:`run_on_torch_distributor`; the function it hands over runs in each of
TorchDistributor's processes, inside :func:`gloo_process_group`, and takes its part of each
global batch with :func:`own_share`. PyTorch is only the yardstick: bigdl_py never imports it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH_DIR)


def torch_available() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


@contextlib.contextmanager
def _environment(**values: str) -> Iterator[None]:
    """Set environment variables for the block (TorchDistributor's processes inherit them)."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def run_on_torch_distributor(function: Callable, processes: int, *args, local_mode: bool = True):
    """Run ``function(*args)`` in ``processes`` processes under TorchDistributor, in the
    active SparkSession: on the driver's machine (``local_mode``), or one per barrier task on
    the executors; return rank 0's result."""
    from pyspark.ml.torch.distributor import TorchDistributor

    search_path = [ROOT, BENCH_DIR, os.environ.get("PYTHONPATH", "")]
    with _environment(
        # One OpenMP thread per process: P processes x 1 thread, as bigdl_py's tasks run.
        OMP_NUM_THREADS="1",
        # The processes are fresh interpreters: they import bigdl_py and the bench's
        # modules (where ``function`` lives) from this checkout.
        PYTHONPATH=os.pathsep.join(path for path in search_path if path),
    ):
        distributor = TorchDistributor(
            num_processes=processes, local_mode=local_mode, use_gpu=False
        )
        return distributor.run(function, *args)


@contextlib.contextmanager
def gloo_process_group() -> Iterator[tuple[int, int]]:
    """In a TorchDistributor process: one thread, the gloo group joined; ``(rank, world)``."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        yield dist.get_rank(), dist.get_world_size()
    finally:
        dist.destroy_process_group()


def own_share(batch, rank: int, world: int):
    """This rank's contiguous part of a global batch (the parts differ by at most one)."""
    return batch[rank * len(batch) // world : (rank + 1) * len(batch) // world]


def ddp_step_timings(
    build_model: Callable,
    features,
    labels,
    global_batch: int,
    warmup: int,
    iterations: int,
    learning_rate: float,
    momentum: float,
    loss_name: str,
) -> list[dict]:
    """In each TorchDistributor process: ``warmup + iterations`` DDP steps (SGD with momentum,
    ``torch.nn.<loss_name>``) on consecutive global batches of ``features`` / ``labels``, this
    rank taking its share; the measured steps' seconds: ``iteration`` (batch slicing included),
    ``forward_backward`` (DDP's gradient all-reduce runs inside backward) and ``update``.

    ``build_model(torch)`` builds the model; it must be importable by these processes (a
    module under bench/ or bigdl_py), as must this function.
    """
    import time

    import torch

    with gloo_process_group() as (rank, world):
        model = torch.nn.parallel.DistributedDataParallel(build_model(torch))
        optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate, momentum=momentum)
        loss_function = getattr(torch.nn, loss_name)()
        timings = []
        for step in range(warmup + iterations):
            started = time.perf_counter()
            rows = own_share(range(step * global_batch, (step + 1) * global_batch), rank, world)
            inputs = torch.from_numpy(features[rows.start : rows.stop])
            targets = torch.from_numpy(labels[rows.start : rows.stop])
            optimizer.zero_grad()
            loss_function(model(inputs), targets).backward()
            backward_done = time.perf_counter()
            optimizer.step()
            done = time.perf_counter()
            timings.append(
                {
                    "iteration": done - started,
                    "forward_backward": backward_done - started,
                    "update": done - backward_done,
                }
            )
        return timings[warmup:]
