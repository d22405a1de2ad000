"""Part 2 of ``bench/gpu.py``: LeNet-5 on Fashion-MNIST trained on the GPU until test accuracy
first reaches a target, by ``LocalOptimizer`` (captured steps) and by the same loop in
PyTorch: the same model and initial weights, batch 128, SGD (lr 0.05, momentum 0.9), a
shuffle per epoch, test accuracy every quarter epoch. Each reports its training throughput
(samples/s, validation time taken out) and the seconds from the start of training to the
validation that reached the target.
"""

from __future__ import annotations

import time

import numpy as np
from time_to_accuracy import torch_lenet

from bigdl_py import nn
from bigdl_py.data import ArrayDataset
from bigdl_py.optim import SGD

FASHION_LEARNING_RATE, FASHION_BATCH, MOMENTUM, SEED = 0.05, 128, 0.9, 1


def fashion_data(directory: str | None, dry_run: bool):
    """(train features, labels), (test features, labels): Fashion-MNIST, or for a dry run a
    small random stand-in of its shapes."""
    if dry_run:
        rng = np.random.default_rng(0)

        def split(count):
            return rng.standard_normal((count, 1, 28, 28)).astype(np.float32), rng.integers(
                0, 10, count
            )

        return split(512), split(256)
    from bigdl_py.data import fashion_mnist

    return fashion_mnist("train", directory), fashion_mnist("test", directory)


def bigdl_to_target(train, test, device: str, target: float, max_epochs: int) -> dict:
    from bigdl_py.models import lenet5
    from bigdl_py.train import (
        LocalOptimizer,
        MaxEpoch,
        MaxScore,
        Or,
        SeveralIteration,
        Top1Accuracy,
    )
    from bigdl_py.train.callbacks import TrainingCallback

    nn.init.manual_seed(SEED)
    model = lenet5().to(device)
    reached = MaxScore(target - 0.5e-4)  # fires strictly above; accuracies step by 1e-4
    optimizer = LocalOptimizer(
        model,
        ArrayDataset(*train, shuffle=True, seed=SEED),
        nn.NLLLoss(),
        SGD(lr=FASHION_LEARNING_RATE, momentum=MOMENTUM),
        batch_size=FASHION_BATCH,
        end_trigger=Or(MaxEpoch(max_epochs), reached),
        progress=False,
    )
    every = max(1, -(-len(train[1]) // FASHION_BATCH) // 4)
    optimizer.set_validation(SeveralIteration(every), test, [Top1Accuracy()], batch_size=500)
    clock = {"validation": 0.0, "reached": None}

    class Watch(TrainingCallback):
        def on_validation_end(self, state, results):
            if clock["reached"] is None and results[0].value >= target:
                clock["reached"] = time.perf_counter() - clock["start"]

    optimizer.add_callback(Watch())
    evaluate = optimizer.runner.evaluate

    def timed_evaluate(*args, **kwargs):  # bench instrumentation: validation time taken out
        started = time.perf_counter()
        try:
            return evaluate(*args, **kwargs)
        finally:
            clock["validation"] += time.perf_counter() - started

    optimizer.runner.evaluate = timed_evaluate
    clock["start"] = time.perf_counter()
    optimizer.optimize()
    total = time.perf_counter() - clock["start"]
    iterations = optimizer.state.iteration
    return {
        "framework": "bigdl_py LocalOptimizer (captured)",
        "samples_per_s": iterations * FASHION_BATCH / max(total - clock["validation"], 1e-9),
        "seconds_to_target": clock["reached"],
        "epochs": iterations * FASHION_BATCH / len(train[1]),
        "accuracy": optimizer.state.score,
    }


def torch_to_target(torch, train, test, device: str, target: float, max_epochs: int) -> dict:
    from bigdl_py.models import lenet5

    nn.init.manual_seed(SEED)
    state = {k: torch.from_numpy(np.array(v)) for k, v in lenet5().state_dict().items()}
    model = torch_lenet()
    model.load_state_dict(state, strict=True)
    device = torch.device(device)
    model = model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=FASHION_LEARNING_RATE, momentum=MOMENTUM)
    pinned = device.type == "cuda"
    features, labels = torch.from_numpy(train[0]), torch.from_numpy(train[1].astype(np.int64))
    test_x = torch.from_numpy(test[0]).to(device)
    test_y = torch.from_numpy(test[1].astype(np.int64)).to(device)
    if pinned:
        features, labels = features.pin_memory(), labels.pin_memory()
    batches = -(-len(labels) // FASHION_BATCH)
    every = max(1, batches // 4)
    generator = np.random.default_rng(SEED)
    start = time.perf_counter()
    validation, reached, iteration, accuracy = 0.0, None, 0, 0.0
    for _ in range(max_epochs):
        order = torch.from_numpy(generator.permutation(len(labels)))
        for batch in range(batches):
            rows = order[batch * FASHION_BATCH : (batch + 1) * FASHION_BATCH]
            x = features[rows].to(device, non_blocking=pinned)
            y = labels[rows].to(device, non_blocking=pinned)
            optimizer.zero_grad(set_to_none=False)
            torch.nn.functional.nll_loss(model(x), y).backward()
            optimizer.step()
            iteration += 1
            if iteration % every == 0 or batch == batches - 1:
                started = time.perf_counter()
                model.eval()
                with torch.no_grad():
                    correct = sum(
                        int((model(test_x[i : i + 500]).argmax(1) == test_y[i : i + 500]).sum())
                        for i in range(0, len(test_y), 500)
                    )
                model.train()
                accuracy = correct / len(test_y)
                validation += time.perf_counter() - started
                if accuracy >= target:
                    reached = time.perf_counter() - start
                    break
        if reached is not None:
            break
    total = time.perf_counter() - start
    return {
        "framework": f"PyTorch {torch.__version__}, the same loop",
        "samples_per_s": iteration * FASHION_BATCH / max(total - validation, 1e-9),
        "seconds_to_target": reached,
        "epochs": iteration * FASHION_BATCH / len(labels),
        "accuracy": accuracy,
    }


def fashion_table(results: list[dict], target: float) -> str:
    lines = [
        f"| LeNet-5, Fashion-MNIST | samples/s | seconds to {target:.0%} | epochs | "
        "last accuracy |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        seconds = (
            "not reached" if r["seconds_to_target"] is None else f"{r['seconds_to_target']:.1f}"
        )
        lines.append(
            f"| {r['framework']} | {r['samples_per_s']:.0f} | {seconds} | {r['epochs']:.2f} "
            f"| {r['accuracy']:.4f} |"
        )
    return "\n".join(lines)
