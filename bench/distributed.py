"""DistriOptimizer speed and long-run boundedness, by hand (results in bench/RESULTS.md).

    python bench/distributed.py lenet [--batch-sizes 128 512] [--partitions 2] [--iterations 160]
                                      [--modes sharded:1 sharded:8 replicated:8 replicated:16]
                                      [--rounds 2] [--jvm-warmup-seconds 60]
    python bench/distributed.py cnn   [--batch-sizes 128] [--partitions 2] [--iterations 20]
    python bench/distributed.py resnet [--batch-size 128] [--partitions 2] [--iterations 6]
                                       [--warmup 2] [--rounds 1] [--jvm-warmup-seconds 0]
                                       [--modes sharded:1 replicated:1 auto local-sgd-4:4]
    python bench/distributed.py long  [--iterations 1000] [--mode sharded:8]
    python bench/distributed.py warmup [--iterations 4800] [--chunk 480] [--mode replicated:16]
    python bench/distributed.py all   [--lenet-iterations 160] [--cnn-iterations 20] [--rounds 2]
                                      [--jvm-warmup-seconds 60]

``all`` prints, in one run and one SparkSession, what the distributed-training issue asks
for: the floor (empty one- and two-stage PySpark jobs with get_spark's settings), ``lenet``
at batch 128 and 512 and ``cnn`` at 128 in the three modes beside LocalOptimizer, the
AllReduce alone for M = 1, 4, 16, 64 MB and N = 2, 4 (``spark_floor.py allreduce``), and the
issue's bars checked against those numbers. ``lenet``, ``cnn`` and ``all`` take
``--conf KEY=VALUE`` (repeatable) over the recommended settings, for A/B runs.

``lenet`` trains LeNet-5 (Fashion-MNIST when installed, else random images of its shape) in
``local[2]`` with bigdl_py's recommended settings, once per mode ``UPDATE:ITERATIONS_PER_JOB``
(``DistriOptimizer(update=..., iterations_per_job=...)``), and reports samples/s and the
per-iteration breakdown the trainer measures (``DistriOptimizer.last_iteration_timings``).
For one iteration per job (median over iterations): ``to_first_task`` (job submission,
scheduling, task deserialisation, Python worker hand-off), ``forward_backward`` (slowest
partition), ``shuffle`` (map output written, stage boundary, fetch, hand-off to the owner's
Python code), ``update`` (slowest owner: sum of the slices + OptimMethod step + state
kept), ``to_driver`` (result back to collect()). For every mode: ``spark`` (the job's time
per iteration less forward-backward and update: Spark's stages, shuffles and Python
hand-offs) and ``driver`` (the loop and building the job's RDDs, per iteration). The same
model's LocalOptimizer samples/s in this process is printed beside it. ``cnn`` does the
same for bench/engine.py's CIFAR CNN on random 3x32x32 images. A mode is
``UPDATE[:ITERATIONS_PER_JOB]``: ``sharded``, ``replicated``, ``one-task``, ``auto`` or
``local-sgd-K`` (``LocalSGD(period=K)``); without a count, DistriOptimizer's default (auto's
own pick for ``auto``). Warm-up and measured iterations are rounded up to whole jobs and
LocalSGD rounds.

``resnet`` is the AllReduce issue's judge at a real model size: ResNet-18 in its CIFAR form
(``bigdl_py.models.resnet18``, 11.2 M parameters, 45 MB of float32 gradient) on random
3x32x32 images, global batch 128, N = 2, cross-entropy, SGD with momentum; every mode
(LocalSGD included; one session, ``--rounds`` times in rotation) with samples/s and the
per-iteration breakdown above, and in the same run PyTorch DDP of the same model
(bench/engine_models.py's twin) under Spark's ``TorchDistributor`` (2 processes x 1 thread,
gloo; bench/torch_peer.py) on the same images, loss and optimizer. It prints the machine (CPU,
cores, load averages at the start and the end), a table of each mode's median round: samples/s,
their ratio to TorchDistributor's, ms per iteration in ``forward_backward``, ``update``,
``spark`` and ``driver`` (for DDP: forward and backward with its overlapped all-reduce, and
the optimizer's step), the share of the iteration outside forward-backward and the update,
and the issue's bar on that share for the exact modes (at most 25 %). One ResNet-18 step at
batch 64 takes seconds on a core, so it measures few iterations and skips the JVM warm-up
and the LocalOptimizer column by default.

**The JVM's warm-up.** For its first minute or so a JVM spends much of a core compiling
Spark's hot paths with C2 (JFR, 35-55 s into a run: 36 C2 compilations took 7.9 s of compiler
time in 20 s, most of them Spark's ClosureCleaner (ASM), Kryo set-up, jar lookups and Java
serialisation), and on two cores that time comes out of the Python workers. A LeNet-5 run at
batch 128 goes from about 2,100 samples/s over its first 480 iterations to 2,600-2,900 once
the compiler is done (bench/RESULTS.md). A training run of minutes lives in the second regime,
so the bench first trains LeNet-5 for ``--jvm-warmup-seconds`` (printing what it reaches, so
the young JVM's speed is on record too), then measures every mode ``--rounds`` times in
rotation and reports each round and the median; the floor is measured in the same warm JVM.
``warmup`` shows the effect: one LeNet-5 run at batch 128 from the JVM's start, its samples/s
per ``--chunk`` iterations.

``long`` runs 1,000 iterations of a small model and samples, every 100 iterations: the
driver's RSS, the executors' Python workers' RSS, the JVM heap in use, the number of
shuffle files under ``spark.local.dir`` and the files of the run's state directory, and
the lineage depth of the iteration's RDD. Flat numbers mean nothing accumulates.
"""

from __future__ import annotations

import argparse
import glob
import math
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bigdl_py import nn  # noqa: E402
from bigdl_py.models import lenet5  # noqa: E402
from bigdl_py.optim import SGD  # noqa: E402
from bigdl_py.spark import LocalSGD  # noqa: E402
from bigdl_py.spark.distri_optimizer import DistriOptimizer  # noqa: E402
from bigdl_py.spark.partitioned_data import run_directory  # noqa: E402
from bigdl_py.spark.session import get_spark  # noqa: E402
from bigdl_py.train import LocalOptimizer, MaxIteration  # noqa: E402

DEFAULT_MODES = [("sharded", 1), ("sharded", 8), ("replicated", 8), ("replicated", 16)]
PHASES = ("to_first_task", "forward_backward", "shuffle", "update", "to_driver")
LEARNING_RATE, MOMENTUM = 0.05, 0.9


def training_images():
    try:
        from bigdl_py.data import fashion_mnist

        return fashion_mnist("train"), "Fashion-MNIST"
    except FileNotFoundError:
        generator = np.random.default_rng(0)
        images = generator.normal(size=(60000, 1, 28, 28)).astype(np.float32)
        return (images, generator.integers(0, 10, 60000)), "random images"


def bench_optimizer(
    model, data, batch_size, iterations, partitions, update, per_job, criterion=None
):
    """The DistriOptimizer every measurement here runs: SGD with momentum, NLL loss unless
    ``criterion`` is given (``update``: a mode's name or object; ``per_job`` None: its
    default)."""
    return DistriOptimizer(
        model,
        data,
        criterion or nn.NLLLoss(),
        SGD(lr=LEARNING_RATE, momentum=MOMENTUM),
        batch_size=batch_size,
        end_trigger=MaxIteration(iterations),
        num_partitions=partitions,
        update=update,
        iterations_per_job=per_job,
        progress=False,
    )


def timed_iterations(optimizer, split_at: int | None = None):
    """Wrap the runner so each call's wall time, iteration count and breakdown are kept.
    A call that would run iteration ``split_at`` (0-based) and ones before it runs as two
    jobs, so that a warm-up of ``split_at`` iterations ends a job even in modes whose jobs
    run 64 iterations or more (one-task)."""
    records = []
    run_iterations = optimizer.runner.run_iterations

    def timed(steps, stop_after_nonfinite):
        started = time.perf_counter()
        results = run_iterations(steps, stop_after_nonfinite)
        records.append(
            (time.perf_counter() - started, len(results), optimizer.last_iteration_timings)
        )
        return results

    def recorded(steps, stop_after_nonfinite):
        first = steps[0].iteration
        if split_at is None or not first < split_at < first + len(steps):
            return timed(steps, stop_after_nonfinite)
        before = timed(steps[: split_at - first], stop_after_nonfinite)
        if len(before) < split_at - first:
            return before
        return before + timed(steps[split_at - first :], stop_after_nonfinite)

    optimizer.runner.run_iterations = recorded
    return records


def run_timed(optimizer, split_at: int | None = None) -> list:
    """Run ``optimizer`` to its end (and release it): the records of ``timed_iterations``."""
    records = timed_iterations(optimizer, split_at)
    with optimizer:
        optimizer.optimize()
    return records


def summarise(records, warmup):
    """Per-iteration means over the calls after ``warmup`` iterations: seconds, forward-
    backward, update, Spark's share, the driver's share; and the one-job phase medians."""
    kept, done = [], 0
    for record in records:
        if done >= warmup:
            kept.append(record)
        done += record[1]
    iterations = sum(count for _, count, _ in kept)
    wall = sum(seconds for seconds, _, _ in kept)
    job = sum(timings["job"] for _, _, timings in kept)
    compute = {
        phase: sum(timings[phase] * count for _, count, timings in kept) / iterations
        for phase in ("forward_backward", "update")
    }
    summary = {
        "iteration": wall / iterations,
        **compute,
        "spark": job / iterations - compute["forward_backward"] - compute["update"],
        "driver": (wall - job) / iterations,
    }
    if all(phase in timings for phase in PHASES for _, _, timings in kept):
        for phase in PHASES:
            summary[phase] = statistics.median(timings[phase] for _, _, timings in kept)
    return summary


def cifar_cnn():
    """bench/engine.py's CIFAR CNN (the same layer list it times against PyTorch)."""
    from engine_models import CIFAR_CNN, build

    return build(nn, CIFAR_CNN)


def cifar_images(count=10000):
    """Random images of CIFAR's shape: the speed does not depend on the pixels."""
    generator = np.random.default_rng(0)
    images = generator.normal(size=(count, 3, 32, 32)).astype(np.float32)
    return (images, generator.integers(0, 10, count)), "random 3x32x32 images"


MODELS = {
    "lenet": ("LeNet-5", lenet5, training_images),
    "cnn": ("CIFAR CNN", cifar_cnn, cifar_images),
}


def parse_mode(text: str) -> tuple[str, int | None]:
    """``UPDATE[:ITERATIONS_PER_JOB]``; without a count, DistriOptimizer's default (auto's
    choice for ``auto``). ``local-sgd-K`` is ``LocalSGD(period=K)``."""
    update, _, per_job = text.partition(":")
    if update.startswith("local-sgd-") and not update[len("local-sgd-") :].isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: local-sgd-K takes a whole period K")
    return update, int(per_job) if per_job else None


def training_mode(update: str):
    """DistriOptimizer's ``update`` for a mode name of this bench (``local-sgd-K``: an object)."""
    if update.startswith("local-sgd-"):
        return LocalSGD(period=int(update[len("local-sgd-") :]))
    return update


def whole_cycles(iterations: int, update: str, per_job: int | None) -> int:
    """``iterations`` rounded up to whole jobs (and whole LocalSGD rounds), so every measured
    job is a full one."""
    cycle = per_job or 1
    if update.startswith("local-sgd-"):
        cycle = math.lcm(cycle, int(update[len("local-sgd-") :]))
    return -(-iterations // cycle) * cycle


def jvm_warm_up(seconds: float) -> None:
    """Train LeNet-5 (batch 128, replicated, 16 per job) in the active session for
    ``seconds``, printing samples/s per run of 160 iterations: the young JVM's speed."""
    if seconds <= 0:
        return
    (features, labels), _ = training_images()
    rates = []
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        optimizer = bench_optimizer(lenet5(), (features, labels), 128, 160, 2, "replicated", 16)
        records = run_timed(optimizer)
        rates.append(128 * 160 / sum(job_seconds for job_seconds, _, _ in records))
    print(
        f"JVM warm-up, {time.perf_counter() - started:.0f} s of LeNet-5 (batch 128, "
        f"replicated:16), samples/s per 160 iterations: {' '.join(f'{r:.0f}' for r in rates)}"
    )


def _median_row(rows: list[dict]) -> dict:
    """The row of the round with the median samples/s (the lower middle one for even)."""
    ordered = sorted(rows, key=lambda row: row["samples_per_second"])
    return ordered[(len(ordered) - 1) // 2]


def bench_model(
    model_key,
    batch_sizes,
    partitions,
    iterations,
    modes,
    warmup=10,
    conf=None,
    spark=None,
    rounds=1,
    jvm_warmup_seconds=0.0,
):
    """Print one row per batch size, mode and round (the modes rotate within each round),
    then each mode's median round; return the median rows as dicts (``spark`` given: use
    that session and leave it running)."""
    name, build_model, load_data = MODELS[model_key]
    own_session = spark is None
    if own_session:
        spark = get_spark("local[2]", app_name="bigdl_py bench distributed", conf=conf)
        spark.sparkContext.setLogLevel("ERROR")
        jvm_warm_up(jvm_warmup_seconds)
    (features, labels), source = load_data()
    print(
        f"{name} on {source}, local[2], {partitions} partitions, {iterations} iterations "
        f"after {warmup} warm-up (rounded up to whole jobs), {rounds} round(s); ms per "
        f"iteration (means; one-job phases: medians)"
    )
    header = ["batch", "update", "per job", "round", "samples/s", "iteration", "forward_backward"]
    header += ["update", "spark", "driver", "to_first_task", "shuffle", "to_driver"]
    print(" | ".join(header) + " | local samples/s")
    medians = []
    for batch_size in batch_sizes:
        local = LocalOptimizer(
            build_model(),
            (features[: batch_size * 40], labels[: batch_size * 40]),
            nn.NLLLoss(),
            SGD(lr=0.05, momentum=0.9),
            batch_size=batch_size,
            end_trigger=MaxIteration(40),
            progress=False,
        )
        started = time.perf_counter()
        local.optimize()
        local_rate = batch_size * 40 / (time.perf_counter() - started)
        by_mode: dict[tuple, list[dict]] = {mode: [] for mode in modes}
        for round_number in range(1, rounds + 1):
            for update, per_job in modes:
                summary = _measure_mode(
                    build_model,
                    features,
                    labels,
                    batch_size,
                    partitions,
                    iterations,
                    warmup,
                    update,
                    per_job,
                )
                row = {
                    "model": name,
                    "batch": batch_size,
                    "mode": f"{update}:{per_job}",
                    "round": round_number,
                    "samples_per_second": batch_size / summary["iteration"],
                    "local_samples_per_second": local_rate,
                    **summary,
                }
                by_mode[(update, per_job)].append(row)
                print(_format_row(row, str(round_number)), flush=True)
        for mode in modes:
            median = _median_row(by_mode[mode])
            medians.append(median)
            if rounds > 1:
                print(_format_row(median, "median"), flush=True)
    if own_session:
        spark.stop()
    return medians


def _measure_mode(
    build_model,
    features,
    labels,
    batch_size,
    partitions,
    iterations,
    warmup,
    update,
    per_job,
    criterion=None,
) -> dict:
    """One DistriOptimizer run of ``iterations`` after ``warmup``, both rounded up to whole
    jobs: its summary, with ``ran`` = the mode and iterations per job it ran (auto's pick)."""
    warm = whole_cycles(warmup, update, per_job)
    optimizer = bench_optimizer(
        build_model(),
        (features, labels),
        batch_size,
        warm + whole_cycles(iterations, update, per_job),
        partitions,
        training_mode(update),
        per_job,
        criterion,
    )
    records = run_timed(optimizer, split_at=warm)
    runner = optimizer.runner
    return {**summarise(records, warm), "ran": f"{runner.mode.name}:{runner.iterations_per_call}"}


def _format_row(row: dict, round_label: str) -> str:
    update, per_job = row["mode"].split(":")
    cells = [str(row["batch"]), update, per_job, round_label]
    cells.append(f"{row['samples_per_second']:.0f}")
    for key in ("iteration", "forward_backward", "update", "spark", "driver"):
        cells.append(f"{row[key] * 1000:.0f}")
    for key in ("to_first_task", "shuffle", "to_driver"):
        cells.append(f"{row[key] * 1000:.0f}" if key in row else "-")
    return " | ".join(cells) + f" | {row['local_samples_per_second']:.0f}"


def bench_all(
    lenet_iterations, cnn_iterations, allreduce_repeats, conf=None, rounds=2, jvm_warmup_seconds=60
):
    """Everything the distributed-training issue asks for, in one run and one session: the
    JVM's warm-up, the floor, LeNet-5 at batch 128 and 512 and the CIFAR CNN at 128 (N = 2,
    every mode, ``rounds`` times, beside LocalOptimizer), the AllReduce alone, and the bars
    checked against the median rounds."""
    import spark_floor
    from pyspark import cloudpickle

    # Its job functions must reach the Python workers, which cannot import bench/ modules.
    cloudpickle.register_pickle_by_value(spark_floor)
    spark = get_spark("local[2]", app_name="bigdl_py bench all", conf=conf)
    spark.sparkContext.setLogLevel("ERROR")
    load = os.getloadavg()[0]
    print(f"# bench/distributed.py all, {time.strftime('%Y-%m-%d %H:%M')}, load average {load:.2f}")
    print("\n## The JVM's warm-up (not measured below)")
    jvm_warm_up(jvm_warmup_seconds)
    jobs = spark_floor._make_jobs(spark)
    floor = {kind: spark_floor._time_ms(jobs[kind], 20, warmup=5) for kind in jobs}
    print("\n## The floor: empty PySpark jobs with get_spark's settings, median of 20 ms")
    print(" | ".join(floor) + "\n" + " | ".join(str(value) for value in floor.values()))
    print("\n## DistriOptimizer, N = 2, local[2]")
    lenet = bench_model(
        "lenet", [128, 512], 2, lenet_iterations, DEFAULT_MODES, spark=spark, rounds=rounds
    )
    cnn_modes = DEFAULT_MODES[:3]  # its compute dominates: 16 per job changes nothing there
    cnn = bench_model("cnn", [128], 2, cnn_iterations, cnn_modes, spark=spark, rounds=rounds)
    print("\n## AllReduce alone (collectives.all_reduce, sum), median ms")
    spark_floor.run_allreduce([1, 4, 16, 64], [2, 4], allreduce_repeats, spark=spark)
    print("\n## The bars (from the rows above)")
    bound = 1.2 * floor["two_stage"]
    for batch, bar in ((512, 3100), (128, 2000)):
        rows = [row for row in lenet if row["batch"] == batch]
        best = max(rows, key=lambda row: row["samples_per_second"])
        verdict = "met" if best["samples_per_second"] >= bar else "NOT met"
        print(
            f"LeNet-5 batch {batch} >= {bar} samples/s: {verdict} (best {best['mode']}: "
            f"{best['samples_per_second']:.0f})"
        )
    for row in lenet + cnn:
        overhead = (row["iteration"] - row["forward_backward"]) * 1e3
        verdict = "met" if overhead <= bound else "NOT met"
        print(
            f"iteration - forward-backward <= 1.2 x floor ({bound:.0f} ms), {row['model']} "
            f"batch {row['batch']} {row['mode']}: {overhead:.0f} ms, {verdict}"
        )
    best_cnn = max(cnn, key=lambda row: row["samples_per_second"])
    print(
        f"CIFAR CNN batch 128: best {best_cnn['mode']} {best_cnn['samples_per_second']:.0f} "
        f"samples/s (goal: PyTorch DDP's ~585; LocalOptimizer here "
        f"{best_cnn['local_samples_per_second']:.0f})"
    )
    spark.stop()


RESNET_MODES = ["sharded:1", "replicated:1", "one-task", "auto", "local-sgd-4:4"]
EXACT_UPDATES = ("sharded", "replicated", "one-task")
OUTSIDE_COMPUTE_BAR = 0.25  # issue 14: an exact mode's share outside forward-backward + update


def machine_description() -> str:
    """The CPU's model name, its cores and the library versions, for the bench's header."""
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            names = [line.split(":", 1)[1].strip() for line in cpuinfo if "model name" in line]
        model = names[0] if names else model
    except OSError:  # no /proc (not Linux)
        pass
    versions = f"python {sys.version.split()[0]}, numpy {np.__version__}"
    return f"{model}, {os.cpu_count()} cores, {versions}"


def load_averages() -> str:
    """The 1, 5 and 15 minute load averages: how busy the machine's cores were."""
    return ", ".join(f"{value:.2f}" for value in os.getloadavg())


def torch_distributor_row(features, labels, batch_size, partitions, iterations, warmup) -> dict:
    """ResNet-18 DDP under TorchDistributor (``partitions`` processes x 1 thread) on the same
    images, global batch, loss and optimizer: the row its samples/s comes from (means)."""
    from engine_models import torch_resnet18
    from torch_peer import ddp_step_timings, run_on_torch_distributor

    steps = run_on_torch_distributor(
        ddp_step_timings,
        partitions,
        torch_resnet18,
        features,
        labels,
        batch_size,
        warmup,
        iterations,
        LEARNING_RATE,
        MOMENTUM,
        "CrossEntropyLoss",
    )
    row = {key: statistics.fmean(step[key] for step in steps) for key in steps[0]}
    return {**row, "mode": "TorchDistributor", "ran": f"DDP, gloo, {partitions} x 1 thread"}


def bench_resnet(batch_size, partitions, iterations, warmup, modes, rounds, conf, jvm_warmup):
    """ResNet-18 (CIFAR form) on random 3x32x32 images: every mode and DDP under
    TorchDistributor in one session, ``rounds`` times in rotation; print each row, then the
    median rounds with their ratio to TorchDistributor's samples/s and the issue's bar."""
    from torch_peer import torch_available

    from bigdl_py.models import resnet18
    from bigdl_py.optim import FlatParameters

    print(f"# bench/distributed.py resnet, {time.strftime('%Y-%m-%d %H:%M %Z')}")
    print(f"# {machine_description()}; load average at start {load_averages()}")
    spark = get_spark(f"local[{partitions}]", app_name="bigdl_py bench resnet", conf=conf)
    spark.sparkContext.setLogLevel("ERROR")
    jvm_warm_up(jvm_warmup)
    longest = max(
        whole_cycles(warmup, update, per_job) + whole_cycles(iterations, update, per_job)
        for update, per_job in modes
    )
    # One epoch holds every run, so no chain is cut short at an epoch's end.
    (features, labels), source = cifar_images(batch_size * max(longest, warmup + iterations))
    with_torch = torch_available()
    weights = FlatParameters(resnet18()).weights
    print(
        f"ResNet-18 (CIFAR form, {weights.size / 1e6:.1f} M parameters, "
        f"{weights.nbytes / 1e6:.0f} MB) on {source}, global batch {batch_size}, "
        f"N = {partitions} (local[{partitions}]), SGD lr {LEARNING_RATE} momentum {MOMENTUM}, "
        f"cross-entropy; {iterations} measured iterations after {warmup} warm-up (both "
        f"rounded up to whole jobs and LocalSGD rounds), {rounds} round(s)"
        + ("" if with_torch else "; torch is not installed: TorchDistributor is left out")
    )
    rows: dict[str, list[dict]] = {}

    def keep(row: dict, round_number: int) -> None:
        row["samples_per_second"] = batch_size / row["iteration"]
        rows.setdefault(row["mode"], []).append(row)
        print(f"round {round_number}: {_resnet_row(row, None)}", flush=True)

    for round_number in range(1, rounds + 1):
        for update, per_job in modes:
            summary = _measure_mode(
                resnet18,
                features,
                labels,
                batch_size,
                partitions,
                iterations,
                warmup,
                update,
                per_job,
                nn.CrossEntropyLoss(),
            )
            mode = update if per_job is None else f"{update}:{per_job}"
            keep({**summary, "mode": mode}, round_number)
        if with_torch:
            torch_row = torch_distributor_row(
                features, labels, batch_size, partitions, iterations, warmup
            )
            keep(torch_row, round_number)
    medians = {mode: _median_row(mode_rows) for mode, mode_rows in rows.items()}
    torch_rate = medians["TorchDistributor"]["samples_per_second"] if with_torch else None
    print(f"\nload average at end {load_averages()}; median round per mode, ms per iteration")
    print(
        "| mode | ran as | samples/s | x TorchDistributor | iteration | forward_backward "
        "| update | spark | driver | outside fb + update |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in medians.values():
        print(_resnet_row(row, torch_rate))
    for mode, row in medians.items():
        if mode.split(":")[0] in (*EXACT_UPDATES, "auto"):
            share = _outside_compute(row)
            verdict = "met" if share <= OUTSIDE_COMPUTE_BAR else "NOT met"
            print(
                f"bar: {mode} spends {share:.0%} of an iteration outside forward-backward and "
                f"the update (at most {OUTSIDE_COMPUTE_BAR:.0%}): {verdict}"
            )
    spark.stop()


def _outside_compute(row: dict) -> float:
    """The share of an iteration spent outside forward-backward and the update."""
    return 1 - (row["forward_backward"] + row["update"]) / row["iteration"]


def _resnet_row(row: dict, torch_rate: float | None) -> str:
    """One Markdown table row (``torch_rate`` None: no ratio column yet)."""
    rate = row.get("samples_per_second") or 0.0
    cells = [row["mode"], row["ran"], f"{rate:.1f}" if rate else "-"]
    cells.append(f"{rate / torch_rate:.2f}" if torch_rate and rate else "-")
    for key in ("iteration", "forward_backward", "update", "spark", "driver"):
        cells.append(f"{row[key] * 1000:.0f}" if key in row else "-")
    cells.append(f"{_outside_compute(row):.0%}")
    return "| " + " | ".join(cells) + " |"


def bench_warmup(iterations: int, chunk: int, mode: tuple[str, int]) -> None:
    """One LeNet-5 run (batch 128) in a fresh session: samples/s per ``chunk`` iterations."""
    spark = get_spark("local[2]", app_name="bigdl_py bench warm-up")
    spark.sparkContext.setLogLevel("ERROR")
    (features, labels), source = training_images()
    optimizer = bench_optimizer(lenet5(), (features, labels), 128, iterations, 2, mode[0], mode[1])
    records = run_timed(optimizer)
    rates, seconds, count, done = [], 0.0, 0, 0
    for job_seconds, job_iterations, _ in records:
        seconds, count, done = seconds + job_seconds, count + job_iterations, done + job_iterations
        if count >= chunk:
            rates.append(f"{done}: {128 * count / seconds:.0f}")
            seconds, count = 0.0, 0
    print(
        f"LeNet-5 on {source}, batch 128, {mode[0]}:{mode[1]}, from the JVM's start; "
        f"samples/s per {chunk} iterations (iterations done: samples/s)"
    )
    print(", ".join(rates))
    spark.stop()


def rss_mb(pid) -> float:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except FileNotFoundError:
        pass
    return float("nan")


def python_worker_rss(rows):
    for _ in rows:
        pass
    yield rss_mb(os.getpid())


def bench_long(iterations, mode, every=100):
    spark = get_spark("local[2]", app_name="bigdl_py bench long run")
    sc = spark.sparkContext
    sc.setLogLevel("ERROR")
    generator = np.random.default_rng(0)
    features = generator.normal(size=(4096, 32)).astype(np.float32)
    labels = generator.integers(0, 4, 4096)
    model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 4), nn.LogSoftmax())
    optimizer = bench_optimizer(model, (features, labels), 64, iterations, 2, mode[0], mode[1])
    local_dir = sc.getConf().get("spark.local.dir", "/tmp")
    runtime = sc._jvm.java.lang.Runtime.getRuntime()
    print(
        "iteration | driver RSS MB | worker RSS MB (max) | JVM heap used MB | shuffle files "
        "| state files | lineage depth | ms/iteration"
    )
    run_iterations = optimizer.runner.run_iterations
    marks = {"time": time.perf_counter(), "done": 0}

    def sampled(steps, stop_after_nonfinite):
        results = run_iterations(steps, stop_after_nonfinite)
        done = steps[0].iteration + len(results)
        if done // every > marks["done"] // every:
            run = optimizer.runner.run
            seconds = (time.perf_counter() - marks["time"]) / (done - marks["done"])
            worker_rss = max(sc.parallelize(range(2), 2).mapPartitions(python_worker_rss).collect())
            shuffle_files = len(glob.glob(os.path.join(local_dir, "blockmgr-*", "*", "shuffle_*")))
            state_files = len(
                glob.glob(os.path.join(run_directory(run.spec.state_dir, run.spec.run_id), "*"))
            )
            heap = (runtime.totalMemory() - runtime.freeMemory()) / 2**20
            print(
                f"{done} | {rss_mb(os.getpid()):.0f} | {worker_rss:.0f} | {heap:.0f} | "
                f"{shuffle_files} | {state_files} | {run.last_lineage_depth} | "
                f"{seconds * 1000:.0f}",
                flush=True,
            )
            marks["time"], marks["done"] = time.perf_counter(), done
        return results

    optimizer.runner.run_iterations = sampled
    with optimizer:
        optimizer.optimize()
    spark.stop()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    lenet = commands.add_parser("lenet")
    lenet.add_argument("--batch-sizes", type=int, nargs="+", default=[128, 512])
    lenet.add_argument("--partitions", type=int, default=2)
    lenet.add_argument("--iterations", type=int, default=160)
    lenet.add_argument("--modes", type=parse_mode, nargs="+", default=DEFAULT_MODES)
    cnn = commands.add_parser("cnn")
    cnn.add_argument("--batch-sizes", type=int, nargs="+", default=[128])
    cnn.add_argument("--partitions", type=int, default=2)
    cnn.add_argument("--iterations", type=int, default=20)
    cnn.add_argument("--modes", type=parse_mode, nargs="+", default=DEFAULT_MODES[:3])
    everything = commands.add_parser("all")
    everything.add_argument("--lenet-iterations", type=int, default=160)
    everything.add_argument("--cnn-iterations", type=int, default=20)
    everything.add_argument("--allreduce-repeats", type=int, default=3)
    for command in (lenet, cnn, everything):
        command.add_argument("--rounds", type=int, default=2, help="measurements of each mode")
        command.add_argument(
            "--jvm-warmup-seconds",
            type=float,
            default=60.0,
            help="train LeNet-5 this long first, so the JVM's JIT compiler is done (0: none)",
        )
        command.add_argument(
            "--conf",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="a Spark setting over get_spark's recommended ones, for A/B runs",
        )
    resnet = commands.add_parser("resnet")
    resnet.add_argument("--batch-size", type=int, default=128, help="the global batch")
    resnet.add_argument("--partitions", type=int, default=2)
    resnet.add_argument("--iterations", type=int, default=6, help="measured, per mode")
    resnet.add_argument("--warmup", type=int, default=2, help="iterations first, not measured")
    resnet.add_argument(
        "--modes",
        type=parse_mode,
        nargs="+",
        default=[parse_mode(mode) for mode in RESNET_MODES],
        metavar="UPDATE[:ITERATIONS_PER_JOB]",
        help="sharded, replicated, one-task, auto or local-sgd-K (LocalSGD(period=K))",
    )
    resnet.add_argument("--rounds", type=int, default=1, help="measurements of each mode")
    resnet.add_argument(
        "--jvm-warmup-seconds",
        type=float,
        default=0.0,
        help="train LeNet-5 this long first (0: none, so the first mode meets the young JVM)",
    )
    resnet.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE")
    long_run = commands.add_parser("long")
    long_run.add_argument("--iterations", type=int, default=1000)
    long_run.add_argument("--mode", type=parse_mode, default=parse_mode("sharded:8"))
    warmup = commands.add_parser("warmup")
    warmup.add_argument("--iterations", type=int, default=4800)
    warmup.add_argument("--chunk", type=int, default=480)
    warmup.add_argument("--mode", type=parse_mode, default=parse_mode("replicated:16"))
    arguments = parser.parse_args(argv)
    conf = dict(setting.split("=", 1) for setting in getattr(arguments, "conf", []))
    if arguments.command in MODELS:
        bench_model(
            arguments.command,
            arguments.batch_sizes,
            arguments.partitions,
            arguments.iterations,
            arguments.modes,
            conf=conf,
            rounds=arguments.rounds,
            jvm_warmup_seconds=arguments.jvm_warmup_seconds,
        )
    elif arguments.command == "all":
        bench_all(
            arguments.lenet_iterations,
            arguments.cnn_iterations,
            arguments.allreduce_repeats,
            conf=conf,
            rounds=arguments.rounds,
            jvm_warmup_seconds=arguments.jvm_warmup_seconds,
        )
    elif arguments.command == "resnet":
        bench_resnet(
            arguments.batch_size,
            arguments.partitions,
            arguments.iterations,
            arguments.warmup,
            arguments.modes,
            arguments.rounds,
            conf,
            arguments.jvm_warmup_seconds,
        )
    elif arguments.command == "warmup":
        bench_warmup(arguments.iterations, arguments.chunk, arguments.mode)
    else:
        bench_long(arguments.iterations, arguments.mode)


if __name__ == "__main__":
    main()
