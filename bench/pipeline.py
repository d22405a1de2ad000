"""Pipeline parallelism's judge (issue 29), by hand: memory, speed and the bars.

    python bench/pipeline.py memory [--memory-width 3584] [--memory-hidden 8]
                                    [--memory-stages 4] [--python-memory-mb MB]
                                    [--memory-factor 2.5]
    python bench/pipeline.py speed  [--stages 2 4] [--micro-batches 1 2 4 8 16]
                                    [--width 2048] [--hidden 8] [--batch-size 512]
                                    [--iterations 4]
    python bench/pipeline.py all    (memory, then speed, then the bars)
    python bench/pipeline.py all --dry-run   (tiny sizes in local[4], a minute: what CI runs)

Each part starts its own Spark application: ``local-cluster[E,1,...]`` with one core an
executor (``E`` = the most partitions a part needs), so every stage of a pipeline is an
executor JVM with its Python worker, as on a cluster. Results go into bench/RESULTS.md.

**memory** trains an MLP of ``--memory-hidden`` layers ``--memory-width`` wide (104 M
parameters, 416 MB; with Adam's two moments 1.25 GB) with ``Pipeline(stages=K)`` for two
iterations, then each data-parallel mode (replicated, sharded) for one, every Python worker
limited to ``--python-memory-mb`` of address space (``spark.executor.pyspark.memory``; by
default a worker's measured baseline plus ``--memory-factor`` x the model's parameter
bytes: enough for one stage's weights, gradient and Adam moments, not for the whole model's).
It prints what each executor's stage held (parameters, optimizer state) and its worker's
peak resident memory against the whole model's, and each data-parallel mode's error.

**speed** trains an MLP (defaults: 33.6 M parameters, one stage's forward-backward of a
micro-batch of 64 samples 10-100 times a Spark stage's ~35 ms) with ``Pipeline(stages=K,
micro_batches=M)`` for every K and M asked, and ``update="replicated"`` on K partitions, and
prints samples/s (median over the jobs after the first), the bubble — the stages' idle share
of the ticks' compute, ``1 - sum of busy / (K x sum over ticks of the busiest stage)`` —
against GPipe's ``(K - 1) / (M + K - 1)``, the idle share of the wall clock, and where one
iteration's ticks spend their time: Spark between ticks (scheduling, shuffle, hand-off),
compute of the busiest stage, the rest of the tasks' Python, and the forwards run again in
a backward (a graph left in another Python worker).

**The bars** (``all``): every executor's parameters and optimizer state at most 1.2 / K of
the whole model's; the data-parallel modes refused with an out-of-memory error; at M = 8,
K = 2 at least 70 % of the replicated mode's samples/s on two executors.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bigdl_py import nn  # noqa: E402
from bigdl_py.optim import Adam  # noqa: E402
from bigdl_py.spark import DistributedTrainingError, DistriOptimizer, Pipeline  # noqa: E402
from bigdl_py.spark.session import get_spark  # noqa: E402
from bigdl_py.train import MaxIteration  # noqa: E402

INPUTS, CLASSES = 256, 10
MB = 1 << 20


def mlp(width: int, hidden: int, inputs: int = INPUTS) -> nn.Sequential:
    """Linear(inputs, width), ``hidden`` x Linear(width, width), Linear(width, classes), with
    ReLUs between: the big layers are equal, so K dividing ``hidden`` balances exactly."""
    with nn.init.seeded(0):
        layers = [nn.Linear(inputs, width), nn.ReLU()]
        for _ in range(hidden):
            layers += [nn.Linear(width, width), nn.ReLU()]
        layers += [nn.Linear(width, CLASSES), nn.LogSoftmax()]
        return nn.Sequential(*layers)


def data(samples: int, inputs: int = INPUTS):
    generator = np.random.default_rng(0)
    features = generator.standard_normal((samples, inputs)).astype(np.float32)
    return features, generator.integers(0, CLASSES, samples)


_OPEN: dict = {}  # the open application: its (master, conf) and session


def session(master: str, conf: dict | None = None):
    """A Spark application of ``master`` and ``conf``: the open one where it is the same
    (both parts of a dry run), else a new one after the open one stops (the memory part's
    Python memory limit must not reach the speed part)."""
    # The executors of a local cluster import bigdl_py from this checkout, whatever an
    # installed copy points at.
    conf = {"spark.executorEnv.PYTHONPATH": ROOT, **(conf or {})}
    key = (master, sorted(conf.items()))
    if _OPEN.get("key") == key:
        return _OPEN["spark"]
    stop_session()
    spark = get_spark(master, app_name="bigdl_py bench/pipeline.py", conf=conf)
    spark.sparkContext.setLogLevel("ERROR")
    _OPEN.update(key=key, spark=spark)
    return spark


def stop_session() -> None:
    if _OPEN:
        _OPEN.pop("spark").stop()
        _OPEN.clear()


def parameter_bytes(model) -> int:
    return int(sum(p.data.nbytes for p in model.parameters()))


def timed_training(model, features, labels, update, batch_size, iterations, spark, **options):
    """Train; the seconds of each job (run_iterations call) and its iterations."""
    optimizer = DistriOptimizer(
        model,
        (features, labels),
        nn.NLLLoss(),
        Adam(lr=1e-4),
        batch_size=batch_size,
        end_trigger=MaxIteration(iterations),
        update=update,
        progress=False,
        spark=spark,
        **options,
    )
    jobs = []
    run_iterations = optimizer.runner.run_iterations

    def timed(steps, stop_after_nonfinite):
        started = time.perf_counter()
        results = run_iterations(steps, stop_after_nonfinite)
        jobs.append((time.perf_counter() - started, len(results)))
        return results

    optimizer.runner.run_iterations = timed
    with optimizer:
        optimizer.optimize()
    mode = optimizer.runner.mode
    return jobs, getattr(mode, "last_reports", []), getattr(mode, "layout", None)


# --- memory ----------------------------------------------------------------------------------


def worker_baseline_mb() -> float:
    """A Python worker's address space once it has imported bigdl_py (local[1], no limit)."""
    spark = session("local[1]")

    def measure(_):
        import bigdl_py.spark.modes.pipeline  # noqa: F401 (what a pipeline task imports)

        with open("/proc/self/status") as status:
            size = next(int(line.split()[1]) for line in status if line.startswith("VmSize:"))
        yield size / 1024

    (baseline,) = spark.sparkContext.parallelize([0], 1).mapPartitions(measure).collect()
    return float(baseline)


def memory_part(arguments) -> dict:
    model = mlp(arguments.memory_width, arguments.memory_hidden)
    whole = parameter_bytes(model)
    stages = arguments.memory_stages
    limit = arguments.python_memory_mb
    if limit is None and not arguments.dry_run:
        limit = int(worker_baseline_mb() + arguments.memory_factor * whole / MB)
    conf = {"spark.executor.pyspark.memory": f"{limit}m"} if limit else {}
    master = "local[4]" if arguments.dry_run else f"local-cluster[{stages},1,2048]"
    print(
        f"\n## memory: an MLP of {whole / MB:.0f} MB of parameters ({whole / MB * 3:.0f} MB "
        f"with Adam's moments), {master}, Python workers limited to "
        f"{limit if limit else 'no'} MB",
        flush=True,
    )
    spark = session(master, conf)
    features, labels = data(arguments.memory_batch * 4)
    report = {"whole_bytes": whole, "limit_mb": limit, "refused": {}}
    _, reports, _ = timed_training(
        model,
        features,
        labels,
        Pipeline(stages=stages, micro_batches=arguments.memory_micro_batches),
        arguments.memory_batch,
        2,
        spark,
    )
    print(f"Pipeline(stages={stages}) trained; per executor (MB):")
    print("stage  parameters  optimizer  params+optimizer / whole  peak RSS")
    shares = []
    for entry in reports:
        memory = entry.memory
        held = memory.parameters + memory.optimizer
        share = held / (3 * whole)  # Adam: the weights and two moments
        shares.append(share)
        print(
            f"{memory.stage:5d}  {memory.parameters / MB:10.1f}  {memory.optimizer / MB:9.1f}"
            f"  {share:24.3f}  {memory.peak_rss / MB:8.0f}"
        )
    print(f"whole model: parameters {whole / MB:.1f}, with Adam {3 * whole / MB:.1f}")
    report["stage_shares"] = shares
    for update in ("sharded", "replicated"):
        try:
            timed_training(
                mlp(arguments.memory_width, arguments.memory_hidden),
                features,
                labels,
                update,
                arguments.memory_batch,
                1,
                spark,
                num_partitions=stages,
            )
            message = "trained (not refused)"
        except DistributedTrainingError as error:
            message = str(error)
        report["refused"][update] = message
        print(f"{update}: {message[:300]}", flush=True)
    return report


# --- speed -----------------------------------------------------------------------------------


def tick_breakdown(reports, stages: int) -> dict:
    """Where the last job's ticks went: Spark between them, the busiest stage's compute,
    the rest of the tasks' Python; the bubble of the forward-backward ticks."""
    by_tick: dict[int, list] = {}
    for entry in reports:
        for tick in entry.ticks:
            by_tick.setdefault(tick.tick, []).append(tick)
    ticks = [by_tick[number] for number in sorted(by_tick)]
    spark = compute = python = 0.0
    for before, now in zip(ticks, ticks[1:], strict=False):
        spark += max(0.0, min(t.entered for t in now) - max(t.left for t in before))
    for now in ticks:
        busiest = max(t.seconds for t in now)
        compute += busiest
        python += max(t.left - t.entered for t in now) - busiest
    busy = sum(t.seconds for now in ticks for t in now)
    capacity = stages * compute
    wall = max(t.left for t in ticks[-1]) - min(t.entered for t in ticks[0])
    return {
        "ticks": len(ticks),
        "spark": spark,
        "compute": compute,
        "python": python,
        "wall": wall,
        "bubble": 1 - busy / capacity if capacity else 0.0,
        "idle_of_wall": 1 - busy / (stages * wall) if wall else 0.0,
        "recomputed": sum(t.recomputed for now in ticks for t in now),
    }


def samples_per_second(jobs, batch_size) -> float:
    measured = jobs[1:] or jobs  # the first job pays the JIT, the cut and the caches
    return statistics.median(batch_size * count / seconds for seconds, count in measured)


def speed_part(arguments) -> dict:
    stages_asked = sorted(set(arguments.stages))
    master = "local[4]" if arguments.dry_run else f"local-cluster[{max(stages_asked)},1,2048]"
    model = mlp(arguments.width, arguments.hidden)
    print(
        f"\n## speed: an MLP of {parameter_bytes(model) / MB:.0f} MB, batch "
        f"{arguments.batch_size}, {master}",
        flush=True,
    )
    spark = session(master)
    features, labels = data(arguments.batch_size * 8)
    results = {"pipeline": {}, "replicated": {}}
    print(
        "K   M   samples/s  bubble  GPipe's  idle/wall  ticks  spark s  compute s  python s  "
        "recomputed"
    )
    for stages in stages_asked:
        for micro_batches in arguments.micro_batches:
            if arguments.batch_size % micro_batches:
                continue
            jobs, reports, layout = timed_training(
                mlp(arguments.width, arguments.hidden),
                features,
                labels,
                Pipeline(stages=stages, micro_batches=micro_batches),
                arguments.batch_size,
                arguments.iterations,
                spark,
            )
            speed = samples_per_second(jobs, arguments.batch_size)
            parts = tick_breakdown(reports, stages)
            gpipe = layout.plan.bubble_fraction
            results["pipeline"][(stages, micro_batches)] = {"samples_per_second": speed, **parts}
            print(
                f"{stages:<3d} {micro_batches:<3d} {speed:9.1f}  {parts['bubble']:6.3f}  "
                f"{gpipe:7.3f}  {parts['idle_of_wall']:9.3f}  {parts['ticks']:5d}  "
                f"{parts['spark']:7.2f}  {parts['compute']:9.2f}  {parts['python']:8.2f}  "
                f"{parts['recomputed']:10d}",
                flush=True,
            )
        jobs, _, _ = timed_training(
            mlp(arguments.width, arguments.hidden),
            features,
            labels,
            "replicated",
            arguments.batch_size,
            arguments.iterations,
            spark,
            num_partitions=stages,
        )
        results["replicated"][stages] = samples_per_second(jobs, arguments.batch_size)
        print(f"replicated on {stages} partitions: {results['replicated'][stages]:.1f} samples/s")
    return results


# --- the bars --------------------------------------------------------------------------------


def bars(memory: dict | None, speed: dict | None, stages: int, dry_run: bool) -> None:
    print("\n## the bars" + (" (a dry run: printed, not judged)" if dry_run else ""))
    if memory is not None:
        limit = 1.2 / stages
        worst = max(memory["stage_shares"])
        print(
            f"per-executor parameters + optimizer <= 1.2/K = {limit:.3f} of the whole: "
            f"{worst:.3f} -> {'pass' if worst <= limit else 'FAIL'}"
        )
        for update, message in memory["refused"].items():
            refused = "memory" in message.lower()
            print(f"{update} refused with an out-of-memory error: {'pass' if refused else 'FAIL'}")
    if speed is not None and (2, 8) in speed["pipeline"] and 2 in speed["replicated"]:
        ratio = speed["pipeline"][(2, 8)]["samples_per_second"] / speed["replicated"][2]
        print(
            f"K = 2, M = 8 against replicated on 2 executors: {ratio:.2f} (bar 0.70) -> "
            f"{'pass' if ratio >= 0.7 else 'FAIL'}"
        )


def parse_arguments(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("part", choices=("memory", "speed", "all"))
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes, local[4]")
    parser.add_argument("--width", type=int, default=2048, help="speed: the MLP's width")
    parser.add_argument("--hidden", type=int, default=8, help="speed: its hidden layers")
    parser.add_argument("--memory-width", type=int, default=3584)
    parser.add_argument("--memory-hidden", type=int, default=8)
    parser.add_argument("--stages", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--micro-batches", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--memory-stages", type=int, default=4)
    parser.add_argument("--memory-micro-batches", type=int, default=4)
    parser.add_argument("--memory-batch", type=int, default=64)
    parser.add_argument("--python-memory-mb", type=int, default=None)
    parser.add_argument("--memory-factor", type=float, default=2.5)
    arguments = parser.parse_args(argv)
    if arguments.dry_run:
        arguments.width = arguments.memory_width = 32
        arguments.hidden = arguments.memory_hidden = 4
        arguments.stages, arguments.micro_batches = [2, 4], [2]
        arguments.batch_size, arguments.iterations = 16, 2
        arguments.memory_batch, arguments.memory_micro_batches = 16, 2
    return arguments


def main(argv=None) -> None:
    arguments = parse_arguments(argv)
    print(
        f"bench/pipeline.py {arguments.part}{' --dry-run' if arguments.dry_run else ''} on "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, load "
        f"{os.getloadavg()[0]:.1f}",
        flush=True,
    )
    memory = speed = None
    if arguments.part in ("memory", "all"):
        memory = memory_part(arguments)
    if arguments.part in ("speed", "all"):
        speed = speed_part(arguments)
    stop_session()
    if arguments.part == "all":
        bars(memory, speed, arguments.memory_stages, arguments.dry_run)
    print(f"load at the end {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
