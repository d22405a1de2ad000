"""Time float32 training steps of bigdl_py against PyTorch on the CPU, and the training loop.

Run by hand: ``python bench/engine.py [--repeats 15] [--threads 1 2] [--models lenet cnn ...]``.

Part 1, the engine. One step is forward, loss, backward and an inline SGD-with-momentum
update (``v = momentum * v + g; w -= lr * v``, one parameter array at a time) of
(``bench/engine_models.py`` builds each in both frameworks):

* LeNet-5: Conv(1->6,5)-Tanh-MaxPool2-Conv(6->12,5)-Tanh-MaxPool2-Linear(192->100)-Tanh-
  Linear(100->10)-LogSoftmax, 1x28x28, batch 128;
* MLP 784-512-512-10 with ReLU (and LogSoftmax for the NLL loss), batch 256;
* CIFAR CNN: Conv(3->32,3,pad1)-ReLU-Conv(32->32,3,pad1)-ReLU-MaxPool2-Conv(32->64,3,pad1)-
  ReLU-Conv(64->64,3,pad1)-ReLU-MaxPool2-Linear(4096->256)-ReLU-Linear(256->10), 3x32x32,
  batch 64;
* ResNet-18 in CIFAR form (``bigdl_py.models.resnet18``), 3x32x32, batch 64, cross-entropy;
* a Transformer text classifier (``bigdl_py.models.transformer_classifier``: token and
  position embeddings, 2 encoder layers of width 128 with 4 heads, dropout 0.1, a mean over
  the tokens), sequences of 128 token ids, batch 32, cross-entropy;
* a bidirectional LSTM text classifier (Embedding 10000x128, LSTM 128 both ways, Linear on
  the two last states), sequences of 128 token ids, batch 32, cross-entropy;
* NCF / NeuMF (``bigdl_py.models.ncf``) on MovieLens-1M's id ranges, batch 1024, MSE on
  ratings.

An entry whose ``bigdl_py.models`` function does not exist yet is skipped with a note.
The first three end in LogSoftmax and take the NLL loss.

Both frameworks build the same layers by the same names (``bigdl_py.nn`` follows PyTorch's),
and PyTorch's model starts from bigdl_py's initial weights (the table's JSON lines give the
difference of the first losses, in evaluation mode). The BLAS thread count is set
with threadpoolctl (``bigdl_py.backend.blas_threads``) and ``torch.set_num_threads``. The two
frameworks take turns in blocks of ``STEPS_PER_BLOCK`` steps (ours, theirs, ours, ...) so that
load from other processes on a shared machine hits both alike; before each block the process
sleeps ``SETTLE_SECONDS`` and runs one untimed step. Alternating single steps was unfair at
two threads: OpenBLAS's and OpenMP's idle threads spin for ~0.1 s after a parallel region
(OpenBLAS's THREAD_TIMEOUT), so each framework's spinning threads took a core from the
other's next step (2026-11-25: torch's MLP step 12.6-20.7 ms alternating, 7.7 alone). The
table gives medians (and fastest runs) after warm-up, and the ratio bigdl_py / torch.

Peak memory is the most memory allocated during one step above what was allocated when it
began (parameters, gradients, velocities and the batch live between steps in both): for
bigdl_py the peak of NumPy's allocations traced by ``tracemalloc`` (in every thread); for
PyTorch the peak of its CPU allocator's "Total Allocated" in a ``torch.profiler`` trace with
``profile_memory=True``. Neither counts BLAS scratch space.

Part 2, the training loop (``--loop-iterations``): LeNet-5 trained for one epoch by
``bigdl_py.train.LocalOptimizer`` (SGD with momentum, ``progress=False``) against a bare
loop over the same batches (same ``ArrayDataset`` shuffle, same flat parameters and
``SGD`` OptimMethod, no triggers or bookkeeping). The loop's overhead is the median, over
alternating runs, of LocalOptimizer's epoch time over the bare loop's, minus one.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # engine_models

from engine_models import LENET5, MODELS, build, images  # noqa: E402

from bigdl_py import backend, nn  # noqa: E402
from bigdl_py.autograd import Tensor, no_grad  # noqa: E402
from bigdl_py.data import ArrayDataset  # noqa: E402
from bigdl_py.optim import SGD, FlatParameters  # noqa: E402

LEARNING_RATE = 0.01
MOMENTUM = 0.9

# Losses by name, in both libraries (see ``engine_models.ModelSpec.loss``).
BIGDL_LOSSES = {"nll": nn.NLLLoss, "cross_entropy": nn.CrossEntropyLoss, "mse": nn.MSELoss}
TORCH_LOSSES = {"nll": "nll_loss", "cross_entropy": "cross_entropy", "mse": "mse_loss"}


# --- one training step ---------------------------------------------------------------------


class BigdlStep:
    """One bigdl_py training step on a fixed batch."""

    def __init__(self, model, inputs: np.ndarray, labels: np.ndarray, loss: str = "nll"):
        self.model = model
        self.parameters = list(model.parameters())
        self.criterion = BIGDL_LOSSES[loss]()
        self.inputs = Tensor(inputs, _copy=False)
        self.labels = labels
        self.velocities = [np.zeros_like(p.data) for p in self.parameters]

    def __call__(self) -> float:
        self.model.zero_grad()
        loss = self.criterion(self.model(self.inputs), self.labels)
        loss.backward()
        for parameter, velocity in zip(self.parameters, self.velocities, strict=True):
            velocity *= MOMENTUM
            velocity += parameter.grad.data
            parameter.data -= LEARNING_RATE * velocity
        return loss.item()

    def evaluation_loss(self) -> float:
        """The loss in evaluation mode, without a step."""
        self.model.eval()
        try:
            with no_grad():
                return self.criterion(self.model(self.inputs), self.labels).item()
        finally:
            self.model.train()


class TorchStep:
    """The same step in PyTorch, starting from the bigdl_py model's weights."""

    def __init__(
        self, torch, model, bigdl_model, inputs: np.ndarray, labels: np.ndarray, loss="nll"
    ):
        self.torch = torch
        self.model = model
        self.loss = getattr(torch.nn.functional, TORCH_LOSSES[loss])
        state = {name: torch.from_numpy(array) for name, array in bigdl_model.state_dict().items()}
        self.model.load_state_dict(state, strict=True)
        self.parameters = list(self.model.parameters())
        self.velocities = [torch.zeros_like(p) for p in self.parameters]
        self.inputs = torch.from_numpy(inputs)
        self.labels = torch.from_numpy(labels)

    def __call__(self) -> float:
        torch = self.torch
        self.model.zero_grad(set_to_none=False)
        loss = self.loss(self.model(self.inputs), self.labels)
        loss.backward()
        with torch.no_grad():
            for parameter, velocity in zip(self.parameters, self.velocities, strict=True):
                velocity.mul_(MOMENTUM).add_(parameter.grad)
                parameter.add_(velocity, alpha=-LEARNING_RATE)
        return loss.item()

    def evaluation_loss(self) -> float:
        """The loss in evaluation mode, without a step."""
        self.model.eval()
        try:
            with self.torch.no_grad():
                return self.loss(self.model(self.inputs), self.labels).item()
        finally:
            self.model.train()


def bigdl_peak_memory(step: Callable) -> int:
    """Peak bytes NumPy allocated during one step above the allocations at its start."""
    tracemalloc.start()
    try:
        start, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        step()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak - start


def torch_peak_memory(torch, step: Callable) -> int:
    """Peak of the CPU allocator's allocated bytes during one step, from a profiler trace."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
        step()
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "trace.json")
        profiler.export_chrome_trace(path)
        with open(path) as trace_file:
            trace = json.load(trace_file)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    totals = [
        event["args"]["Total Allocated"]
        for event in events
        if event.get("name") == "[memory]" and "Total Allocated" in event.get("args", {})
    ]
    return max(totals, default=0)


@contextlib.contextmanager
def thread_limit(count: int, torch):
    """``count`` BLAS threads for NumPy (threadpoolctl) and ``count`` threads for PyTorch."""
    previous = torch.get_num_threads() if torch is not None else None
    if torch is not None:
        torch.set_num_threads(count)
    try:
        with backend.blas_threads(count):
            yield
    finally:
        if torch is not None:
            torch.set_num_threads(previous)


def seconds(run: Callable) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


STEPS_PER_BLOCK = 5
SETTLE_SECONDS = 0.3


def measure_step(key: str, threads: int, repeats: int, warmup: int, torch) -> dict:
    """Median and fastest step times (ms), and peak memory (MB), of both frameworks."""
    spec = MODELS[key]
    with nn.init.seeded(0):
        model = spec.build()
    inputs, labels = spec.batch(0)
    steps = {"bigdl": BigdlStep(model, inputs, labels, spec.loss)}
    if torch is not None:
        twin = spec.build_torch(torch)
        steps["torch"] = TorchStep(torch, twin, model, inputs, labels, spec.loss)
    result = {"model": spec.name, "threads": threads}
    with thread_limit(threads, torch):
        # Same weights, same batch: the losses agree, or the models differ. Taken in
        # evaluation mode, where dropout (whose masks differ between the libraries) is off.
        first_losses = {framework: step.evaluation_loss() for framework, step in steps.items()}
        for _ in range(warmup):
            for step in steps.values():
                step()
        times = {framework: [] for framework in steps}
        for _ in range(-(-repeats // STEPS_PER_BLOCK)):
            for framework, step in steps.items():
                time.sleep(SETTLE_SECONDS)  # the other framework's spinning threads sleep
                step()  # untimed: this framework's data back in cache
                times[framework].extend(seconds(step) for _ in range(STEPS_PER_BLOCK))
        for framework, samples in times.items():
            result[f"{framework}_ms"] = 1000 * statistics.median(samples)
            result[f"{framework}_best_ms"] = 1000 * min(samples)
        result["bigdl_peak_mb"] = bigdl_peak_memory(steps["bigdl"]) / 2**20
        if torch is not None:
            result["torch_peak_mb"] = torch_peak_memory(torch, steps["torch"]) / 2**20
            result["first_loss_difference"] = abs(first_losses["bigdl"] - first_losses["torch"])
    return result


# --- the training loop against a bare loop ----------------------------------------------------


def local_optimizer_epoch(model, dataset: ArrayDataset, batch_size: int) -> None:
    from bigdl_py.train import LocalOptimizer, MaxEpoch

    LocalOptimizer(
        model,
        dataset,
        nn.NLLLoss(),
        SGD(lr=LEARNING_RATE, momentum=MOMENTUM),
        batch_size=batch_size,
        end_trigger=MaxEpoch(1),
        progress=False,
    ).optimize()


def bare_epoch(model, dataset: ArrayDataset, batch_size: int) -> None:
    """What LocalOptimizer's iteration does, and nothing else."""
    flat = FlatParameters(model)
    criterion = nn.NLLLoss()
    sgd = SGD(lr=LEARNING_RATE, momentum=MOMENTUM)
    (features,), labels = dataset.features, dataset.labels
    for indices in dataset.global_batch_indices(0, batch_size):
        flat.zero_grad()
        loss = criterion(model(Tensor(features[indices], _copy=False)), labels[indices])
        loss.item()
        loss.backward()
        sgd.step(flat.weights, flat.gradients)


def measure_loop(threads: int, repeats: int, iterations: int) -> dict:
    """Samples/s of LocalOptimizer and of the bare loop on LeNet-5, and the overhead."""
    batch_size = 128
    features, labels = images((batch_size * iterations, 1, 28, 28))(1)
    dataset = ArrayDataset(features, labels, shuffle=True, seed=0)
    with nn.init.seeded(0):
        model = build(nn, LENET5)
    runs = {"local_optimizer": local_optimizer_epoch, "bare_loop": bare_epoch}
    times = {kind: [] for kind in runs}
    with thread_limit(threads, None):
        for run in runs.values():  # warm-up
            run(model, dataset, batch_size)
        for _ in range(repeats):
            for kind, run in runs.items():
                times[kind].append(seconds(lambda run=run: run(model, dataset, batch_size)))
    ratios = [
        loop / bare for loop, bare in zip(times["local_optimizer"], times["bare_loop"], strict=True)
    ]
    samples = len(dataset)
    return {
        "threads": threads,
        "iterations": iterations,
        "local_optimizer_samples_per_s": samples / statistics.median(times["local_optimizer"]),
        "bare_loop_samples_per_s": samples / statistics.median(times["bare_loop"]),
        "overhead_percent": 100 * (statistics.median(ratios) - 1),
    }


# --- report ------------------------------------------------------------------------------


def machine_description(torch) -> str:
    from threadpoolctl import threadpool_info

    blas = [
        f"{info['internal_api']} {info.get('version')} ({info.get('architecture', '?')})"
        for info in threadpool_info()
        if info["user_api"] == "blas"
    ]
    parts = [
        f"{backend.cpu_count()} cores",
        f"python {platform.python_version()}",
        f"numpy {np.__version__}",
        f"BLAS {', '.join(blas) or 'none found'}",
    ]
    if torch is not None:
        parts.append(f"torch {torch.__version__}")
    return ", ".join(parts)


def step_table(results: list[dict]) -> str:
    """Markdown: medians and their ratio, fastest runs and theirs, peak memory."""
    lines = [
        "| model | threads | bigdl_py median ms | torch median ms | ratio | bigdl_py best ms "
        "| torch best ms | best ratio | bigdl_py peak MB | torch peak MB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        has_torch = "torch_ms" in r
        cells = [
            r["model"],
            str(r["threads"]),
            f"{r['bigdl_ms']:.1f}",
            f"{r['torch_ms']:.1f}" if has_torch else "-",
            f"{r['bigdl_ms'] / r['torch_ms']:.2f}" if has_torch else "-",
            f"{r['bigdl_best_ms']:.1f}",
            f"{r['torch_best_ms']:.1f}" if has_torch else "-",
            f"{r['bigdl_best_ms'] / r['torch_best_ms']:.2f}" if has_torch else "-",
            f"{r['bigdl_peak_mb']:.1f}",
            f"{r['torch_peak_mb']:.1f}" if has_torch else "-",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def loop_table(results: list[dict]) -> str:
    lines = [
        "| threads | LocalOptimizer samples/s | bare loop samples/s | loop overhead |",
        "|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['threads']} | {r['local_optimizer_samples_per_s']:.0f} "
            f"| {r['bare_loop_samples_per_s']:.0f} | {r['overhead_percent']:+.1f} % |"
        )
    return "\n".join(lines)


def load_average() -> str:
    try:
        return ", ".join(f"{value:.2f}" for value in os.getloadavg())
    except OSError:  # not available on this platform
        return "unknown"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--repeats", type=int, default=15, help="timed steps per framework")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--loop-iterations",
        type=int,
        default=40,
        help="batches per epoch of the LocalOptimizer comparison (0 skips it)",
    )
    parser.add_argument("--loop-repeats", type=int, default=7)
    parser.add_argument("--no-torch", action="store_true", help="time bigdl_py only")
    args = parser.parse_args(argv)
    torch = None
    if not args.no_torch:
        try:
            import torch  # optional benchmark peer, never used by bigdl_py
        except ImportError:
            print("torch not installed: timing bigdl_py only", file=sys.stderr)
    print(machine_description(torch))
    print(f"load average (1, 5, 15 min) at start: {load_average()}")
    step_results = []
    for key in args.models:
        missing = MODELS[key].missing()
        if missing is not None:
            print(f"skipping {key}: {missing}")
            continue
        for threads in args.threads:
            step_results.append(measure_step(key, threads, args.repeats, args.warmup, torch))
            print(json.dumps(step_results[-1]), file=sys.stderr, flush=True)
    loop_results = []
    if args.loop_iterations > 0:
        for threads in args.threads:
            loop_results.append(measure_loop(threads, args.loop_repeats, args.loop_iterations))
            print(json.dumps(loop_results[-1]), file=sys.stderr, flush=True)
    print(step_table(step_results))
    if loop_results:
        print()
        print(loop_table(loop_results))
    # Other processes on a shared machine slow both frameworks, 2-thread runs most of all.
    print(f"load average (1, 5, 15 min) at end: {load_average()}")


if __name__ == "__main__":
    main()
