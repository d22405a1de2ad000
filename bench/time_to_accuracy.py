"""Time to accuracy: LeNet-5 on Fashion-MNIST until test accuracy first reaches a target.

    python bench/time_to_accuracy.py [--modes sharded replicated auto local-sgd:4 local-sgd:8
                                      local-sgd:16 torch] [--target 0.88] [--max-epochs 10]
                                      [--batch-size 128] [--partitions 2] [--rounds 1]
    python bench/time_to_accuracy.py --cluster [--modes ...] [--max-iterations N]
                                     [--event-logs DIR]
    python bench/time_to_accuracy.py main-job [--rounds 1]

A mode is ``UPDATE[/ITERATIONS_PER_JOB]``: a registered name with its settings
(``local-sgd:8:117`` is ``LocalSGD(period=8, warmup_iterations=117)``), and the iterations
per job when not DistriOptimizer's default.

The training-modes issue's judge. Every mode runs in a fresh Python process (so in a fresh
JVM, as a user's job would), in ``local[P]`` with ``P = --partitions``, on the same model
(``bigdl_py.models.lenet5``), data (Fashion-MNIST standardised as ``fashion_mnist`` does),
global batch and optimizer (SGD, lr 0.05, momentum 0.9). The clock starts before the
SparkSession is built and stops when the validation that first reaches ``--target`` has
finished; test accuracy is measured every quarter epoch (``SeveralIteration``) and its time is
counted. Per mode it prints the seconds to the target, the iterations and epochs it took, the
validations on the way, the training throughput (samples/s of the iterations alone:
validation time taken out) and the per-iteration breakdown DistriOptimizer measures
(``forward_backward``, ``update``, ``spark``: the job's time beyond both, ``driver``).

``torch`` is PyTorch DDP under Spark's own ``pyspark.ml.torch.distributor.TorchDistributor``
(``local_mode=True``, P processes x 1 thread, gloo; bench/torch_peer.py), the tool a Spark
user would otherwise pick: the same LeNet-5, data, global batch (each rank takes its half of
the same shuffled global batch), optimizer and validation schedule (each rank scores half the
test set and the counts are summed with ``all_reduce``); its clock starts before its
SparkSession too. It runs only when ``torch==2.13.0`` is installed.

``--cluster`` measures on a standalone cluster whose two workers act as two hosts
(``scripts/local_cluster.sh --hosts 127.0.0.2,127.0.0.3 --separate-disks``: 1 core each, no
shared disk; ``--hosts`` and ``--cores`` lay out another), started before the first
contender and stopped after the last. bigdl_py's contenders leave ``num_partitions`` to
DistriOptimizer there, as a user would. Every
contender is then a fresh application on it (``spark.cores.max`` 2, one 1-core executor per
host, ``conf/spark-cluster.conf``'s wait for both executors), and ``torch`` runs under
``TorchDistributor(local_mode=False)``: one barrier task per executor, each starting its DDP
process there. ``--max-iterations`` stops a contender early (for its samples/s and
breakdown); ``--event-logs DIR`` keeps each application's Spark event log there, for
``bench/spark_timeline.py``.

``main-job`` runs ``jobs/train_lenet.py`` as a user would, with its defaults and then with the
first wave's defaults (``--update sharded --iterations-per-job 8``), side by side, and prints
the seconds until the job printed a test accuracy of at least the target (the job validates
once per epoch).

Run it on an otherwise idle machine: two processes share its cores.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH_DIR)
sys.path.insert(0, ROOT)
sys.path.insert(0, BENCH_DIR)

from torch_peer import torch_available  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "scripts"))
from local_cluster import TWO_HOSTS, LocalCluster  # noqa: E402

DEFAULT_MODES = [
    "sharded",
    "replicated",
    "auto",
    "local-sgd:4",
    "local-sgd:8",
    "local-sgd:16",
    "torch",
]
LEARNING_RATE, MOMENTUM, SEED = 0.05, 0.9, 1


def quarter_epoch_iterations(samples: int, batch_size: int) -> int:
    """Validate at least every quarter epoch: the iterations between two validations."""
    batches = -(-samples // batch_size)
    return max(1, batches // 4)


def session(arguments, name: str):
    """The contender's SparkSession: ``local[P]``, or the cluster ``arguments.master``."""
    from bigdl_py.spark.session import get_spark

    conf = json.loads(arguments.spark_conf or "{}")
    if arguments.event_logs:
        conf["spark.eventLog.enabled"] = "true"
        conf["spark.eventLog.dir"] = arguments.event_logs
        # One plain JSON file per application (Spark 4 rolls and compresses by default).
        conf["spark.eventLog.compress"] = "false"
        conf["spark.eventLog.rolling.enabled"] = "false"
    master = arguments.master or f"local[{arguments.partitions}]"
    spark = get_spark(master, app_name=f"time to accuracy: {name}", conf=conf)
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def cluster_session_conf(cluster: LocalCluster) -> dict:
    """What every contender sets on the two-host cluster: ``cluster.session_conf()``,
    ``conf/spark-cluster.conf``'s scheduler settings (both executors registered before the
    first job), 1 GB executors, and this checkout on the executors' Python path (bigdl_py,
    and the bench modules TorchDistributor's processes import)."""
    from bigdl_py.spark.session import parse_spark_defaults

    with open(os.path.join(ROOT, "conf", "spark-cluster.conf")) as handle:
        cluster_file = parse_spark_defaults(handle.read())
    scheduler = {key: value for key, value in cluster_file.items() if ".scheduler." in key}
    conf = {
        **scheduler,
        **cluster.session_conf(),
        "spark.executor.memory": "1g",
        "spark.executorEnv.PYTHONPATH": os.pathsep.join([ROOT, BENCH_DIR]),
    }
    if os.environ.get("BIGDL_PY_STATE_DIR"):  # a directory every host shares, as a user sets it
        conf["spark.executorEnv.BIGDL_PY_STATE_DIR"] = os.environ["BIGDL_PY_STATE_DIR"]
    return conf


def update_for(mode: str) -> tuple[str, int | None]:
    """DistriOptimizer's ``update`` and ``iterations_per_job`` for a mode name of this bench:
    ``UPDATE[/ITERATIONS_PER_JOB]``, where UPDATE is a registered name with its settings
    (``local-sgd:8:117`` is ``LocalSGD(period=8, warmup_iterations=117)``)."""
    update, _, per_job = mode.partition("/")
    return update, int(per_job) if per_job else None


def run_bigdl_mode(mode: str, arguments) -> dict:
    """One bigdl_py run to the target, in this (fresh) process; the clock includes Spark's start."""
    started = time.perf_counter()
    from distributed import summarise, timed_iterations

    from bigdl_py import nn
    from bigdl_py.data import fashion_mnist
    from bigdl_py.models import lenet5
    from bigdl_py.optim import SGD
    from bigdl_py.spark import DistriOptimizer
    from bigdl_py.train import MaxEpoch, MaxIteration, MaxScore, Or, SeveralIteration, Top1Accuracy
    from bigdl_py.train.batches import as_array_dataset

    spark = session(arguments, mode)
    session_seconds = time.perf_counter() - started
    train = fashion_mnist("train")
    test = as_array_dataset(fashion_mnist("test"), "test set", shuffle=False)
    nn.init.manual_seed(SEED)
    # MaxScore fires on a score strictly above its bound; accuracies are multiples of 1e-4.
    reached = MaxScore(arguments.target - 0.5e-4)
    optimizer = DistriOptimizer(
        lenet5(),
        train,
        nn.NLLLoss(),
        SGD(lr=LEARNING_RATE, momentum=MOMENTUM),
        batch_size=arguments.batch_size,
        end_trigger=Or(
            MaxEpoch(arguments.max_epochs), MaxIteration(arguments.max_iterations), reached
        ),
        # On a cluster, as a user leaves it: the default (auto's layout, the task slots).
        num_partitions=None if arguments.master else arguments.partitions,
        update=update_for(mode)[0],
        iterations_per_job=update_for(mode)[1],
        seed=SEED,
        progress=False,
        spark=spark,
    )
    every = quarter_epoch_iterations(len(train[1]), arguments.batch_size)
    optimizer.set_validation(SeveralIteration(every), test, [Top1Accuracy()], batch_size=500)
    validations = []
    validate = optimizer._validate

    def timed_validation():
        # Bench-only instrumentation: the loop's one validation call, timed from outside.
        validation_started = time.perf_counter()
        validate()
        validations.append(
            {
                "seconds": time.perf_counter() - started,
                "validation_seconds": time.perf_counter() - validation_started,
                "iteration": optimizer.state.iteration,
                "accuracy": optimizer.state.score,
            }
        )

    optimizer._validate = timed_validation
    records = timed_iterations(optimizer)
    with optimizer:
        optimizer.optimize()
    total = time.perf_counter() - started
    iterations = optimizer.state.iteration
    training_seconds = sum(seconds for seconds, _, _ in records)
    hit = next((v for v in validations if v["accuracy"] >= arguments.target), None)
    breakdown = summarise(records, warmup=min(32, iterations // 2))
    return {
        "mode": mode,
        "seconds_to_target": hit["seconds"] if hit else None,
        "total_seconds": total,
        "session_seconds": session_seconds,
        "iterations": hit["iteration"] if hit else iterations,
        "epochs": (hit["iteration"] if hit else iterations) * arguments.batch_size / 60000,
        "samples_per_second": iterations * arguments.batch_size / training_seconds,
        "validations": validations,
        "breakdown_ms": {key: value * 1000 for key, value in breakdown.items()},
        "update_chosen": getattr(optimizer, "update_description", None),
        "application": spark.sparkContext.applicationId,
    }


def torch_lenet():
    """LeNet-5 exactly as ``bigdl_py.models.lenet5`` builds it, in PyTorch."""
    import torch.nn as tnn

    return tnn.Sequential(
        tnn.Conv2d(1, 6, 5),
        tnn.Tanh(),
        tnn.MaxPool2d(2),
        tnn.Conv2d(6, 12, 5),
        tnn.Tanh(),
        tnn.MaxPool2d(2),
        tnn.Flatten(),
        tnn.Linear(12 * 4 * 4, 100),
        tnn.Tanh(),
        tnn.Linear(100, 10),
        tnn.LogSoftmax(dim=1),
    )


def ddp_train_to_target(target, batch_size, max_epochs, every, max_iterations):
    """The function TorchDistributor runs in each of its processes (rank 0's result is kept)."""
    import time

    import numpy as np
    import torch
    import torch.distributed as dist
    from time_to_accuracy import LEARNING_RATE, MOMENTUM, SEED, torch_lenet
    from torch_peer import gloo_process_group, own_share

    from bigdl_py.data import fashion_mnist

    with gloo_process_group() as (rank, world):
        features, labels = fashion_mnist("train")
        test_features, test_labels = fashion_mnist("test")
        features, labels = torch.from_numpy(features), torch.from_numpy(labels.astype(np.int64))
        test_x = torch.from_numpy(own_share(test_features, rank, world))
        test_y = torch.from_numpy(own_share(test_labels, rank, world).astype(np.int64))
        torch.manual_seed(SEED)
        model = torch.nn.parallel.DistributedDataParallel(torch_lenet())
        optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE, momentum=MOMENTUM)
        loss_function = torch.nn.NLLLoss()
        generator = np.random.default_rng(SEED)
        validations, iteration, training_seconds = [], 0, 0.0
        for _epoch in range(max_epochs):
            order = torch.from_numpy(generator.permutation(len(labels)))
            for first in range(0, len(order), batch_size):
                step_started = time.perf_counter()
                batch = order[first : first + batch_size]
                own = own_share(batch, rank, world)
                optimizer.zero_grad()
                # DDP averages gradients over ranks; each rank's loss is its half's mean, so the
                # step is the global batch's mean gradient when the halves are equal (64 + 64).
                loss_function(model(features[own]), labels[own]).backward()
                optimizer.step()
                training_seconds += time.perf_counter() - step_started
                iteration += 1
                if iteration >= max_iterations:
                    return {
                        "validations": validations,
                        "iterations": iteration,
                        "training_seconds": training_seconds,
                    }
                if iteration % every:
                    continue
                validation_started = time.perf_counter()
                with torch.no_grad():
                    correct = torch.zeros(2, dtype=torch.float64)
                    for low in range(0, len(test_y), 500):
                        predicted = model.module(test_x[low : low + 500]).argmax(dim=1)
                        correct[0] += (predicted == test_y[low : low + 500]).sum().item()
                    correct[1] = len(test_y)
                    dist.all_reduce(correct)
                accuracy = float(correct[0] / correct[1])
                validations.append(
                    {
                        # The wall clock, shared with the parent process (perf_counter is not).
                        "wall_time": time.time(),
                        "validation_seconds": time.perf_counter() - validation_started,
                        "iteration": iteration,
                        "accuracy": accuracy,
                    }
                )
                if accuracy >= target:
                    return {
                        "validations": validations,
                        "iterations": iteration,
                        "training_seconds": training_seconds,
                    }
        return {
            "validations": validations,
            "iterations": iteration,
            "training_seconds": training_seconds,
        }


def run_torch_distributor(arguments) -> dict:
    """DDP under TorchDistributor to the target; the clock includes its SparkSession's start."""
    started, started_wall = time.perf_counter(), time.time()
    from torch_peer import run_on_torch_distributor

    spark = session(arguments, "torch")
    session_seconds = time.perf_counter() - started
    every = quarter_epoch_iterations(60000, arguments.batch_size)
    result = run_on_torch_distributor(
        ddp_train_to_target,
        arguments.partitions,
        arguments.target,
        arguments.batch_size,
        arguments.max_epochs,
        every,
        arguments.max_iterations,
        local_mode=arguments.master is None,
    )
    validations = [{**v, "seconds": v["wall_time"] - started_wall} for v in result["validations"]]
    hit = next((v for v in validations if v["accuracy"] >= arguments.target), None)
    total = time.perf_counter() - started
    return {
        "mode": "torch",
        "seconds_to_target": hit["seconds"] if hit else None,
        "total_seconds": total,
        "session_seconds": session_seconds,
        "iterations": result["iterations"],
        "epochs": result["iterations"] * arguments.batch_size / 60000,
        "samples_per_second": result["iterations"]
        * arguments.batch_size
        / result["training_seconds"],
        "validations": validations,
        "breakdown_ms": {},
        "update_chosen": "DDP, gloo, TorchDistributor "
        + ("local_mode" if arguments.master is None else "local_mode=False"),
        "application": spark.sparkContext.applicationId,
    }


def run_child(mode: str, arguments) -> None:
    """Entry of a fresh process: run one mode and print its result as one JSON line."""
    result = (
        run_torch_distributor(arguments) if mode == "torch" else run_bigdl_mode(mode, arguments)
    )
    print("RESULT " + json.dumps(result), flush=True)


def run_in_fresh_process(mode: str, arguments) -> dict | None:
    command = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        mode,
        "--target",
        str(arguments.target),
        "--max-epochs",
        str(arguments.max_epochs),
        "--batch-size",
        str(arguments.batch_size),
        "--partitions",
        str(arguments.partitions),
        "--max-iterations",
        str(arguments.max_iterations),
    ]
    if arguments.master:
        command += ["--master", arguments.master, "--spark-conf", arguments.spark_conf]
    if arguments.event_logs:
        command += ["--event-logs", arguments.event_logs]
    completed = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    for line in completed.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    print(f"{mode}: failed (exit {completed.returncode})\n{completed.stderr[-3000:]}")
    return None


def format_result(result: dict, torch_seconds: float | None) -> str:
    seconds = result["seconds_to_target"]
    shown = f"{seconds:7.1f} s" if seconds is not None else "   not reached"
    ratio = f"{seconds / torch_seconds:5.2f}x" if seconds and torch_seconds else "   - "
    breakdown = " ".join(
        f"{k}={v:.1f}"
        for k, v in result["breakdown_ms"].items()
        if k in ("iteration", "forward_backward", "update", "spark", "driver")
    )
    return (
        f"{result['mode']:<13} {shown} {ratio}  {result['iterations']:5d} it "
        f"({result['epochs']:.2f} ep)  {result['samples_per_second']:7.0f} samples/s  "
        f"session {result['session_seconds']:.1f} s  {breakdown}"
    )


def bench_modes(arguments) -> None:
    modes = [m for m in arguments.modes if m != "torch" or torch_available()]
    if len(modes) < len(arguments.modes):
        print("torch is not installed: TorchDistributor is left out")
    results: dict[str, list] = {mode: [] for mode in modes}
    for round_number in range(arguments.rounds):
        for mode in modes:
            result = run_in_fresh_process(mode, arguments)
            if result is not None:
                results[mode].append(result)
                print(f"round {round_number + 1}: {format_result(result, None)}", flush=True)
                if result.get("update_chosen"):
                    print(f"    update: {result['update_chosen']}")
                curve = ", ".join(
                    f"{v['seconds']:.0f}s/{v['accuracy']:.4f}" for v in result["validations"]
                )
                print(f"    validations (time/accuracy): {curve}", flush=True)
    medians = {
        mode: statistics.median(r["seconds_to_target"] for r in rows)
        for mode, rows in results.items()
        if rows and all(r["seconds_to_target"] is not None for r in rows)
    }
    print(
        f"\nmedian seconds to {arguments.target:.0%} over {arguments.rounds} round(s); "
        f"load average before: {arguments.load:.2f}"
    )
    torch_seconds = medians.get("torch")
    for rows in results.values():
        if rows:
            ordered = sorted(rows, key=lambda r: r["seconds_to_target"] or float("inf"))
            print(format_result(ordered[(len(ordered) - 1) // 2], torch_seconds))
    ours = {mode: seconds for mode, seconds in medians.items() if mode != "torch"}
    if ours and torch_seconds:
        best = min(ours, key=ours.get)
        print(
            f"bar: best bigdl_py mode ({best}) {ours[best]:.1f} s vs TorchDistributor "
            f"{torch_seconds:.1f} s = {ours[best] / torch_seconds:.2f}x (bar: <= 1.0x)"
        )
    if "auto" in ours and "sharded" in ours and "replicated" in ours:
        faster = min(ours["sharded"], ours["replicated"])
        print(
            f"bar: auto {ours['auto']:.1f} s vs the faster exact mode {faster:.1f} s = "
            f"{ours['auto'] / faster:.2f}x (bar: <= 1.10x)"
        )


ACCURACY_LINE = re.compile(r"[Tt]est accuracy[^0-9]*([0-9.]+)\s*(%?)")


def run_main_job(extra: list[str], target: float) -> dict:
    """``jobs/train_lenet.py`` as a user runs it; seconds until it printed the target accuracy."""
    command = [
        sys.executable,
        "-u",
        os.path.join(ROOT, "jobs", "train_lenet.py"),
        "--no-progress",
        "--output",
        os.path.join("/tmp", "tta_main_job"),
        "--overwrite",  # each round replaces the previous round's output
        *extra,
    ]
    started = time.perf_counter()
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT
    )
    reached, accuracies = None, []
    for line in process.stdout:
        match = ACCURACY_LINE.search(line)
        if match:
            value = float(match.group(1)) / (100 if match.group(2) else 1)
            accuracies.append((time.perf_counter() - started, value))
            if reached is None and value >= target:
                reached = time.perf_counter() - started
    process.wait()
    return {
        "arguments": " ".join(extra) or "(defaults)",
        "seconds_to_target": reached,
        "total_seconds": time.perf_counter() - started,
        "accuracies": accuracies,
        "exit": process.returncode,
    }


def bench_main_job(arguments) -> None:
    variants = [[], ["--update", "sharded", "--iterations-per-job", "8"]]
    rows: dict[str, list] = {}
    for _ in range(arguments.rounds):
        for extra in variants:
            result = run_main_job(extra, arguments.target)
            rows.setdefault(result["arguments"], []).append(result)
            curve = ", ".join(f"{s:.0f}s/{a:.4f}" for s, a in result["accuracies"])
            print(
                f"main job {result['arguments']}: to {arguments.target:.0%} "
                f"{result['seconds_to_target']} s, whole job {result['total_seconds']:.0f} s "
                f"(exit {result['exit']}); accuracy per epoch: {curve}",
                flush=True,
            )
    medians = {
        key: statistics.median(r["seconds_to_target"] for r in value)
        for key, value in rows.items()
        if all(r["seconds_to_target"] is not None for r in value)
    }
    new, old = medians.get("(defaults)"), medians.get(" ".join(variants[1]))
    if new and old:
        print(
            f"bar: defaults {new:.1f} s vs first wave's defaults {old:.1f} s = "
            f"{old / new:.2f}x sooner (bar: >= 2x)"
        )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", nargs="?", choices=("modes", "main-job"), default="modes")
    parser.add_argument("--modes", nargs="+", default=DEFAULT_MODES)
    parser.add_argument("--target", type=float, default=0.88)
    parser.add_argument("--max-epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--max-iterations", type=int, default=10**9)
    parser.add_argument("--cluster", action="store_true")
    parser.add_argument("--hosts", default=",".join(TWO_HOSTS), help="the cluster's workers")
    parser.add_argument("--cores", type=int, default=1, help="cores of each worker")
    parser.add_argument("--event-logs", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--master", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--spark-conf", default=None, help=argparse.SUPPRESS)
    arguments = parser.parse_args(argv)
    if arguments.child:
        run_child(arguments.child, arguments)
        return
    arguments.load = os.getloadavg()[0]
    where = f"local[{arguments.partitions}]"
    if arguments.cluster:
        hosts = arguments.hosts.split(",")
        where = (
            f"a standalone cluster of {len(hosts)} hosts x {arguments.cores} cores "
            f"({', '.join(hosts)}, no shared disk)"
        )
    print(
        f"time to {arguments.target:.0%} test accuracy, LeNet-5 on Fashion-MNIST, {where}, "
        f"global batch {arguments.batch_size}, SGD lr {LEARNING_RATE} momentum {MOMENTUM}; "
        f"{os.cpu_count()} CPUs; numpy {np.__version__}; commit {commit()}"
    )
    if arguments.what == "main-job":
        bench_main_job(arguments)
    elif arguments.cluster:
        if arguments.event_logs:
            os.makedirs(arguments.event_logs, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="bigdl_py-tta-cluster-") as directory:
            hosts = arguments.hosts.split(",")
            with LocalCluster(directory, hosts, cores=arguments.cores, memory="2g") as cluster:
                arguments.master = cluster.url
                arguments.spark_conf = json.dumps(cluster_session_conf(cluster))
                # TorchDistributor's processes: one per core, as Spark's task slots.
                arguments.partitions = len(hosts) * arguments.cores
                bench_modes(arguments)
    else:
        bench_modes(arguments)


def commit() -> str:
    """The checkout's commit (with ``+`` when files differ from it), for the record."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            cwd=ROOT,
        ).stdout.strip()
    except OSError:
        return "unknown"
    return head + ("+" if dirty else "")


if __name__ == "__main__":
    main()
