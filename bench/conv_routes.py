"""Time one float32 convolution layer's forward and gradients on each route, against PyTorch.

Run by hand: ``python bench/conv_routes.py [--threads 2 1] [--repeats 9] [--layers cifar resnet]``.

For each layer of ``bench/engine.py``'s CIFAR CNN (batch 64), LeNet-5 (batch 128, with
``--layers lenet``) and ResNet-18's distinct geometries (batch 64): ``conv2d`` forward, then
backward with a ones output gradient (input, weight and bias gradients; the first layer of
each model needs no input gradient), on
bigdl_py's oneDNN route (``conv_onednn``), its im2col route (``BIGDL_PY_ONEDNN=0``), and
``torch.nn.functional.conv2d`` at the same thread count. The three take turns, each timed
``--repeats`` times after one untimed call, over ``--rounds`` rounds; the table gives each
one's median in ms and its best round, with the ratios to PyTorch.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from functools import partial

import numpy as np

from bigdl_py import backend
from bigdl_py.autograd import Tensor, ops
from bigdl_py.autograd.ops import onednn

# (name, input shape, weight shape, stride, padding, needs input gradient)
LAYERS = {
    "cifar": [
        ("cifar conv1 3->32 32x32", (64, 3, 32, 32), (32, 3, 3, 3), 1, 1, False),
        ("cifar conv2 32->32 32x32", (64, 32, 32, 32), (32, 32, 3, 3), 1, 1, True),
        ("cifar conv3 32->64 16x16", (64, 32, 16, 16), (64, 32, 3, 3), 1, 1, True),
        ("cifar conv4 64->64 16x16", (64, 64, 16, 16), (64, 64, 3, 3), 1, 1, True),
    ],
    "lenet": [
        ("lenet conv1 1->6 28x28", (128, 1, 28, 28), (6, 1, 5, 5), 1, 0, False),
        ("lenet conv2 6->12 12x12", (128, 6, 12, 12), (12, 6, 5, 5), 1, 0, True),
    ],
    "resnet": [
        ("resnet stem 3->64 32x32", (64, 3, 32, 32), (64, 3, 3, 3), 1, 1, False),
        ("resnet 64->64 32x32", (64, 64, 32, 32), (64, 64, 3, 3), 1, 1, True),
        ("resnet 64->128 /2", (64, 64, 32, 32), (128, 64, 3, 3), 2, 1, True),
        ("resnet 128->128 16x16", (64, 128, 16, 16), (128, 128, 3, 3), 1, 1, True),
        ("resnet 1x1 64->128 /2", (64, 64, 32, 32), (128, 64, 1, 1), 2, 0, True),
        ("resnet 256->256 8x8", (64, 256, 8, 8), (256, 256, 3, 3), 1, 1, True),
        ("resnet 512->512 4x4", (64, 512, 4, 4), (512, 512, 3, 3), 1, 1, True),
    ],
}


def bigdl_step(x, weight, bias, stride, padding, needs_input):
    tx = Tensor(x, requires_grad=needs_input, _copy=False)
    tw = Tensor(weight, requires_grad=True, _copy=False)
    tb = Tensor(bias, requires_grad=True, _copy=False)
    out = ops.conv2d(tx, tw, tb, stride=stride, padding=padding)
    out.backward(Tensor(np.ones(out.shape, dtype=np.float32)))


def torch_step(torch, x, weight, bias, stride, padding, needs_input):
    tx = x.requires_grad_(needs_input)
    tw = weight.requires_grad_(True)
    tb = bias.requires_grad_(True)
    tw.grad = tb.grad = tx.grad = None
    out = torch.nn.functional.conv2d(tx, tw, tb, stride=stride, padding=padding)
    out.backward(torch.ones_like(out))


def timed(function, repeats: int) -> float:
    function()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[2, 1])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--layers", nargs="+", default=["cifar", "resnet"], choices=LAYERS)
    args = parser.parse_args()
    if not onednn.available():
        raise SystemExit("conv_routes: oneDNN's library is not installed (onednn-cpu-gomp)")
    try:
        import torch
    except ImportError:
        torch = None
    print(
        f"{os.cpu_count()} cores, {platform.processor() or platform.machine()}, "
        f"torch {torch.__version__ if torch else 'absent'}, load {os.getloadavg()}"
    )
    print(
        "| layer | threads | oneDNN ms | im2col ms | torch ms | oneDNN / torch | im2col / torch |"
    )
    print("|---|---|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    for threads in args.threads:
        if torch is not None:
            torch.set_num_threads(threads)
        for group in args.layers:
            for name, x_shape, w_shape, stride, padding, needs_input in LAYERS[group]:
                x = rng.standard_normal(x_shape).astype(np.float32)
                weight = (rng.standard_normal(w_shape) * 0.1).astype(np.float32)
                bias = np.zeros(w_shape[0], dtype=np.float32)
                settings = (stride, padding, needs_input)
                results: dict[str, list[float]] = {"onednn": [], "im2col": [], "torch": []}
                with backend.blas_threads(threads):
                    for _ in range(args.rounds):
                        for route in ("onednn", "im2col"):
                            os.environ[onednn.SWITCH_VARIABLE] = "1" if route == "onednn" else "0"
                            results[route].append(
                                timed(partial(bigdl_step, x, weight, bias, *settings), args.repeats)
                            )
                        os.environ.pop(onednn.SWITCH_VARIABLE, None)
                        if torch is not None:
                            tensors = [torch.from_numpy(a.copy()) for a in (x, weight, bias)]
                            results["torch"].append(
                                timed(partial(torch_step, torch, *tensors, *settings), args.repeats)
                            )
                medians = {
                    k: statistics.median(v) if v else float("nan") for k, v in results.items()
                }
                ratio = {k: medians[k] / medians["torch"] for k in ("onednn", "im2col")}
                print(
                    f"| {name} | {threads} | {medians['onednn']:.1f} | {medians['im2col']:.1f} "
                    f"| {medians['torch']:.1f} | {ratio['onednn']:.2f} | {ratio['im2col']:.2f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
