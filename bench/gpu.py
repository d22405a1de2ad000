"""Time training steps on a GPU: bigdl_py eager and captured against PyTorch CUDA, in one process.

Run by hand on a GPU machine (``scripts/gpu_check.sh`` runs it after the GPU tests)::

    python bench/gpu.py [--models lenet cnn resnet18 transformer bilstm ncf] [--steps 20]
                        [--blocks 7] [--fashion-mnist DIR | --no-fashion] [--target 0.88]
    python bench/gpu.py --dry-run     # one tiny run of every part, on the strict device

Part 1, one training step per model of ``bench/engine_models.py`` at the batches of issue
28's table: forward, loss, backward and an SGD-with-momentum update (lr 0.01, momentum 0.9).
bigdl_py's step is ``LocalOptimizer``'s own (``train.runner.LocalRunner.run_iteration``: the
batch copied from host memory, the loss copied back behind the step), eager
(``cuda_graphs=False``) and captured (a CUDA graph replayed, ``bigdl_py.step_graph``).
PyTorch's is the usual loop: the batch copied from pinned memory (``non_blocking``),
``zero_grad``, forward, loss, backward, ``torch.optim.SGD.step``. Both start from the same
weights; both read each loss one step late, as ``LocalOptimizer`` does (reading it at once
would make every step wait for the GPU). Per framework:

* **step ms**: the median over ``--blocks`` blocks of ``--steps`` steps of the wall time per
  step (the frameworks take turns block by block);
* **kernel ms**: the GPU's own time per step: a spin kernel holds the GPU while ``--steps``
  steps are queued behind it, and CUDA events around them time the GPU alone;
* **waits**: ``0`` when the host finished queuing those steps before the spin ended (no step
  waited for the device), ``>=1`` otherwise; bigdl_py's reads of device data per step are
  also counted exactly, on the strict device (``device_waits.counting_reads``);
* **first ms**: the first step of a fresh model (kernel compilation, cuDNN plans), and for
  the captured run the capture (its second step).

Part 2 (``bench/gpu_fashion.py``): LeNet-5 on Fashion-MNIST trained on the GPU until test
accuracy first reaches ``--target``: ``LocalOptimizer`` (captured steps) against the same
loop in PyTorch (same model, initial weights, batch 128, SGD lr 0.05 momentum 0.9,
shuffles, test accuracy every quarter epoch). Each gives its training throughput
(samples/s, validation excluded) and the seconds from the start of training to the
validation that reached the target.

The output ends with markdown tables for ``bench/RESULTS.md``, the card named. ``--dry-run``
(and any machine without CUDA) runs every part once, tiny, on the strict test device and
PyTorch on the CPU: a check that the script runs, not a measurement.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR.parent))
sys.path.insert(0, str(BENCH_DIR))  # engine_models

from engine_models import MODELS  # noqa: E402
from gpu_fashion import bigdl_to_target, fashion_data, fashion_table, torch_to_target  # noqa: E402

from bigdl_py import backend, device_waits, nn  # noqa: E402
from bigdl_py.data import ArrayDataset  # noqa: E402
from bigdl_py.optim import SGD  # noqa: E402
from bigdl_py.train.runner import LocalRunner, TrainingSetup  # noqa: E402

LEARNING_RATE, MOMENTUM = 0.01, 0.9
# The batches of issue 28's table.
CASES = {
    "lenet": (128,),
    "cnn": (64, 256),
    "resnet18": (64, 256),
    "transformer": (32, 128),
    "bilstm": (32,),
    "ncf": (1024,),
    "mlp": (256,),
}
DEFAULT_MODELS = ["lenet", "cnn", "resnet18", "transformer", "bilstm", "ncf"]
NAMES = {  # as issue 28's table names them
    "lenet": "LeNet-5",
    "cnn": "CIFAR CNN",
    "resnet18": "ResNet-18 (CIFAR)",
    "transformer": "Transformer classifier",
    "bilstm": "BiLSTM",
    "ncf": "NCF",
    "mlp": "MLP",
}
BIGDL_LOSSES = {"nll": nn.NLLLoss, "cross_entropy": nn.CrossEntropyLoss, "mse": nn.MSELoss}
TORCH_LOSSES = {"nll": "nll_loss", "cross_entropy": "cross_entropy", "mse": "mse_loss"}


# --- the device: a GPU, or the strict test device for a dry run ------------------------------


class Gpu:
    """CUDA synchronisation, events and the spin kernel (through CuPy)."""

    name = "cuda"

    def __init__(self):
        self.cupy = backend.cupy_module()
        self._spin = self.cupy.RawKernel(
            'extern "C" __global__ void spin(long long cycles) {'
            "  long long start = clock64(); while (clock64() - start < cycles) {} }",
            "spin",
        )
        name = self.cupy.cuda.runtime.getDeviceProperties(0)["name"]
        self.card = name.decode() if isinstance(name, bytes) else str(name)
        self._cycles_per_second = self._spin_rate()

    def _spin_rate(self) -> float:
        """Cycles of ``clock64`` per second, timed by events (CUDA 13's device properties
        no longer give the clock rate)."""
        cuda, cycles = self.cupy.cuda, 50_000_000
        self._spin((1,), (1,), (np.int64(cycles),))  # compiled and the clock up
        start, end = cuda.Event(), cuda.Event()
        start.record()
        self._spin((1,), (1,), (np.int64(cycles),))
        end.record()
        end.synchronize()
        return cycles / (cuda.get_elapsed_time(start, end) / 1000)

    def synchronize(self) -> None:
        self.cupy.cuda.Device().synchronize()

    def description(self, torch) -> str:
        runtime = self.cupy.cuda.runtime
        parts = [
            self.card,
            f"CuPy {self.cupy.__version__}",
            f"CUDA runtime {runtime.runtimeGetVersion()}",
            f"driver {runtime.driverGetVersion()}",
        ]
        if torch is not None:
            parts.append(f"torch {torch.__version__}")
        return ", ".join(parts)

    def gpu_time(self, queue: Callable[[], None], steps: int, spin_seconds: float):
        """``queue()`` (``steps`` steps, no reads) behind a spin of ``spin_seconds``: the GPU's
        ms per step, and whether the host finished queuing before the spin ended."""
        cuda = self.cupy.cuda
        spun, start, end = (cuda.Event() for _ in range(3))
        self._spin((1,), (1,), (np.int64(spin_seconds * self._cycles_per_second),))
        spun.record()
        start.record()
        queue()
        end.record()
        returned_first = not spun.done
        end.synchronize()
        return cuda.get_elapsed_time(start, end) / steps, returned_first


class StrictDevice:
    """The dry run's stand-in: no events, no spin, nothing to wait for."""

    name = "strict"
    card = "strict test device (dry run: not a measurement)"

    def synchronize(self) -> None:
        pass

    def description(self, torch) -> str:
        version = f", torch {torch.__version__} on the CPU" if torch is not None else ""
        return f"{self.card}, numpy {np.__version__}{version}"

    def gpu_time(self, queue: Callable[[], None], steps: int, spin_seconds: float):
        queue()
        return None, None


# --- one framework's training step -------------------------------------------------------------


def batch_of(spec, size: int) -> tuple[np.ndarray, np.ndarray]:
    """``size`` samples drawn (with replacement) from the spec's batch."""
    features, labels = spec.batch(0)
    rows = np.random.default_rng(1).integers(0, len(features), size)
    return np.ascontiguousarray(features[rows]), np.ascontiguousarray(labels[rows])


def fresh_model(spec):
    with nn.init.seeded(0):
        return spec.build()


class BigdlStep:
    """``LocalOptimizer``'s iteration on one batch, eager or captured; returns a DeviceLoss."""

    def __init__(self, spec, features, labels, device: str, captured: bool):
        self.model = fresh_model(spec).to(device)
        dataset = ArrayDataset(features, labels, shuffle=False)
        self.runner = LocalRunner(cuda_graphs=captured)
        optim_method = SGD(lr=LEARNING_RATE, momentum=MOMENTUM)
        criterion = BIGDL_LOSSES[spec.loss]()
        setup = TrainingSetup(self.model, criterion, optim_method, dataset, len(features))
        self.runner.prepare(setup)
        self.indices = np.arange(len(features))
        self.count = 0

    def __call__(self):
        self.count += 1
        device_waits.begin_step(self.count)
        return self.runner.run_iteration(0, self.count - 1, 0, self.indices).loss

    @staticmethod
    def read(loss) -> float:
        return loss.value()

    def refusals(self) -> list[str]:
        return sorted(set(self.runner.step_graph.refusals.values()))


class TorchStep:
    """The usual PyTorch loop's step, from the bigdl_py model's initial weights."""

    def __init__(self, torch, spec, features, labels, device: str):
        self.torch = torch
        self.device = torch.device(device)
        twin = spec.build_torch(torch)
        state = {
            k: torch.from_numpy(np.array(v)) for k, v in fresh_model(spec).state_dict().items()
        }
        twin.load_state_dict(state, strict=True)
        self.model = twin.to(self.device).train()
        self.optimizer = torch.optim.SGD(
            self.model.parameters(), lr=LEARNING_RATE, momentum=MOMENTUM
        )
        self.loss = getattr(torch.nn.functional, TORCH_LOSSES[spec.loss])
        self.inputs, self.labels = torch.from_numpy(features), torch.from_numpy(labels)
        if self.device.type == "cuda":
            self.inputs, self.labels = self.inputs.pin_memory(), self.labels.pin_memory()

    def __call__(self):
        inputs = self.inputs.to(self.device, non_blocking=True)
        labels = self.labels.to(self.device, non_blocking=True)
        self.optimizer.zero_grad(set_to_none=False)
        loss = self.loss(self.model(inputs), labels)
        loss.backward()
        self.optimizer.step()
        return loss.detach()

    @staticmethod
    def read(loss) -> float:
        return float(loss.item())

    def refusals(self) -> list[str]:
        return []


def run_steps(step, count: int) -> None:
    """``count`` steps, each loss read one step late (as LocalOptimizer reads them)."""
    pending = None
    with device_waits.no_device_waits():
        for _ in range(count):
            loss = step()
            if pending is not None:
                with device_waits.device_sync_point("the loss one step late"):
                    step.read(pending)
            pending = loss
    with device_waits.device_sync_point("the last loss"):
        step.read(pending)


def queue_steps(step, count: int) -> list:
    """``count`` steps queued, nothing read (for the GPU-time measurement)."""
    with device_waits.no_device_waits():
        return [step() for _ in range(count)]


@dataclass
class Timing:
    first_ms: float = 0.0
    capture_ms: float | None = None
    step_ms: list = None
    kernel_ms: float | None = None
    returned_first: bool | None = None


def measure_case(key, batch, device, gpu, torch, steps, blocks, warmup) -> dict:
    """Step times, GPU times, waits and first steps of every framework on one case."""
    spec = MODELS[key]
    features, labels = batch_of(spec, batch)
    makers = {
        "eager": lambda: BigdlStep(spec, features, labels, device, captured=False),
        "captured": lambda: BigdlStep(spec, features, labels, device, captured=True),
    }
    if torch is not None:
        torch_device = "cuda" if gpu.name == "cuda" else "cpu"
        makers["torch"] = lambda: TorchStep(torch, spec, features, labels, torch_device)
    runs, timings = {}, {}
    for name, make in makers.items():
        step = runs[name] = make()
        timing = timings[name] = Timing(step_ms=[])
        gpu.synchronize()
        started = time.perf_counter()
        run_steps(step, 1)
        gpu.synchronize()
        timing.first_ms = 1000 * (time.perf_counter() - started)
        if name == "captured":  # its second step is the capture (and its first launch)
            started = time.perf_counter()
            run_steps(step, 1)
            gpu.synchronize()
            timing.capture_ms = 1000 * (time.perf_counter() - started)
        run_steps(step, warmup)
    for _ in range(blocks):  # the frameworks take turns, block by block
        for name, step in runs.items():
            gpu.synchronize()
            started = time.perf_counter()
            run_steps(step, steps)
            gpu.synchronize()
            timings[name].step_ms.append(1000 * (time.perf_counter() - started) / steps)
    for name, step in runs.items():
        host_seconds = statistics.median(timings[name].step_ms) / 1000 * steps
        losses = []
        kernel_ms, returned_first = gpu.gpu_time(
            lambda step=step, losses=losses: losses.extend(queue_steps(step, steps)),
            steps,
            spin_seconds=max(1.0, 3 * host_seconds),
        )
        with device_waits.device_sync_point("after the GPU-time measurement"):
            for loss in losses:
                step.read(loss)
        timings[name].kernel_ms, timings[name].returned_first = kernel_ms, returned_first
    result = {"model": NAMES[key], "key": key, "batch": batch}
    for name, timing in timings.items():
        result[name] = {
            "step_ms": statistics.median(timing.step_ms),
            "kernel_ms": timing.kernel_ms,
            "waits": None if timing.returned_first is None else (0 if timing.returned_first else 1),
            "first_ms": timing.first_ms,
            "capture_ms": timing.capture_ms,
            "refusals": runs[name].refusals(),
        }
    return result


def strict_reads_per_step(key: str, captured: bool) -> float:
    """bigdl_py's reads of device data per step, counted on the strict device (4 samples,
    the steps after the first: a captured run's capture and replays)."""
    spec = MODELS[key]
    features, labels = batch_of(spec, 4)
    step = BigdlStep(spec, features, labels, "strict", captured=captured)
    run_steps(step, 1)
    with device_waits.counting_reads() as counter:
        run_steps(step, 3)
    return counter.reads / 3


# --- report ----------------------------------------------------------------------------------


def _ms(value) -> str:
    return "-" if value is None else f"{value:.2f}"


def step_table(results: list[dict]) -> str:
    lines = [
        "| model | batch | bigdl_py eager ms | bigdl_py captured ms | PyTorch ms | captured / "
        "PyTorch | kernel ms (eager / captured / PyTorch) | waits per step (eager / captured / "
        "PyTorch; reads counted: eager / captured) | first step ms (eager / PyTorch), capture "
        "ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        eager, captured, peer = r["eager"], r["captured"], r.get("torch", {})

        def waits(run):
            return "-" if run.get("waits") is None else ("0" if run["waits"] == 0 else ">=1")

        ratio = "-"
        if peer:
            ratio = f"{captured['step_ms'] / peer['step_ms']:.2f}x"
        cells = [
            r["model"],
            str(r["batch"]),
            _ms(eager["step_ms"]),
            _ms(captured["step_ms"]),
            _ms(peer.get("step_ms")),
            ratio,
            " / ".join(_ms(run.get("kernel_ms")) for run in (eager, captured, peer)),
            " / ".join(waits(run) for run in (eager, captured, peer))
            + f"; {r['reads_eager']:g} / {r['reads_captured']:g}",
            f"{_ms(eager['first_ms'])} / {_ms(peer.get('first_ms'))}, "
            f"{_ms(captured['capture_ms'])}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def import_torch(wanted: bool):
    if not wanted:
        return None
    try:
        import torch  # the yardstick only; bigdl_py never imports it
    except ImportError:
        print("torch not installed: timing bigdl_py only", file=sys.stderr)
        return None
    return torch


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=DEFAULT_MODELS, choices=list(CASES))
    parser.add_argument("--steps", type=int, default=20, help="steps per timed block")
    parser.add_argument("--blocks", type=int, default=7, help="timed blocks per framework")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps after the first")
    parser.add_argument("--fashion-mnist", default=None, help="the IDX files' directory")
    parser.add_argument("--no-fashion", action="store_true", help="skip part 2")
    parser.add_argument("--target", type=float, default=0.88)
    parser.add_argument("--max-epochs", type=int, default=15)
    parser.add_argument("--no-torch", action="store_true", help="time bigdl_py only")
    parser.add_argument(
        "--dry-run", action="store_true", help="one tiny run of every part on the strict device"
    )
    args = parser.parse_args(argv)
    dry_run = args.dry_run or not backend.cuda_available()
    if dry_run and not args.dry_run:
        print("no CUDA device: a dry run on the strict test device", file=sys.stderr)
    gpu = StrictDevice() if dry_run else Gpu()
    device = "strict" if dry_run else "cuda"
    steps, blocks, warmup = (2, 1, 1) if dry_run else (args.steps, args.blocks, args.warmup)
    torch = import_torch(not args.no_torch)
    lines = [
        f"## {gpu.card}",
        "",
        f"{gpu.description(torch)}; {platform.python_version()}; "
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
    ]
    print("\n".join(lines), flush=True)
    results = []
    for key in args.models:
        missing = MODELS[key].missing()
        if missing is not None:
            print(f"skipping {key}: {missing}")
            continue
        for batch in (4,) if dry_run else CASES[key]:
            result = measure_case(key, batch, device, gpu, torch, steps, blocks, warmup)
            result["reads_eager"] = strict_reads_per_step(key, captured=False)
            result["reads_captured"] = strict_reads_per_step(key, captured=True)
            results.append(result)
            print(json.dumps(result), file=sys.stderr, flush=True)
    report = ["", step_table(results)]
    refused = {r["key"]: r["captured"]["refusals"] for r in results if r["captured"]["refusals"]}
    if refused:
        report += ["", f"Steps that ran eagerly in the captured runs: {json.dumps(refused)}"]
    if not args.no_fashion:
        train, test = fashion_data(args.fashion_mnist, dry_run)
        target = 0.0 if dry_run else args.target
        epochs = 1 if dry_run else args.max_epochs
        fashion = [bigdl_to_target(train, test, device, target, epochs)]
        if torch is not None:
            torch_device = "cpu" if dry_run else "cuda"
            fashion.append(torch_to_target(torch, train, test, torch_device, target, epochs))
        for row in fashion:
            print(json.dumps(row), file=sys.stderr, flush=True)
        report += ["", fashion_table(fashion, target)]
    text = "\n".join(report)
    print(text, flush=True)
    return "\n".join(lines) + "\n" + text


if __name__ == "__main__":
    main()
