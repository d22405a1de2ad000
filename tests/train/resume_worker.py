"""Run by test_exact_resume.py in fresh Python processes (not a test module itself).

    python resume_worker.py first  <sgd|adam> <checkpoint dir> <output dir>
    python resume_worker.py resume <sgd|adam> <checkpoint manifest> <output file>

``first`` trains two epochs straight (weights to ``<output dir>/straight.npz``), then trains
again from the same seeds for one epoch, keeping a checkpoint every 4 iterations (8 per
epoch: one mid-epoch, one at the epoch's end). ``resume`` builds the model from *other*
seeds, resumes from the manifest and trains to the end of epoch 2.
"""

from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from train_models import make_blobs  # noqa: E402

from bigdl_py import backend, nn  # noqa: E402
from bigdl_py.autograd import ops  # noqa: E402
from bigdl_py.data import ArrayDataset  # noqa: E402
from bigdl_py.optim import SGD, Adam, Step  # noqa: E402
from bigdl_py.train import LocalOptimizer, MaxEpoch, SeveralIteration  # noqa: E402


def build_model(seed: int):
    with nn.init.seeded(seed):
        return nn.Sequential(
            nn.Linear(8, 16),
            nn.Tanh(),
            nn.Dropout(0.3),  # draws from the shared generator
            nn.Linear(16, 16),
            nn.Tanh(),
            nn.Dropout(0.2, seed=seed),  # its own generator
            nn.Linear(16, 3),
            nn.LogSoftmax(),
        )


def optimizer_for(kind: str, seed: int, end_trigger):
    ops.manual_seed(seed)
    optim_method = {
        "sgd": lambda: SGD(lr=0.05, momentum=0.9, schedule=Step(5, gamma=0.7)),
        "adam": lambda: Adam(lr=0.01),
    }[kind]()
    features, labels = make_blobs()
    dataset = ArrayDataset(features, labels, batch_size=30, seed=11)
    return LocalOptimizer(
        build_model(seed),
        dataset,
        nn.NLLLoss(),
        optim_method,
        batch_size=30,
        end_trigger=end_trigger,
        progress=False,
    )


def save_weights(optimizer, path: str) -> None:
    np.savez(path, **optimizer.model.state_dict())


def main() -> None:
    backend.set_blas_threads(1)
    mode, kind, checkpoint_path, output = sys.argv[1:5]
    if mode == "first":
        straight = optimizer_for(kind, seed=1, end_trigger=MaxEpoch(2))
        straight.optimize()
        save_weights(straight, os.path.join(output, "straight.npz"))
        first = optimizer_for(kind, seed=1, end_trigger=MaxEpoch(1))
        first.set_checkpoint(checkpoint_path, SeveralIteration(4), overwrite=False)
        first.optimize()
    elif mode == "resume":
        resumed = optimizer_for(kind, seed=2, end_trigger=MaxEpoch(2))
        resumed.resume_from(checkpoint_path)
        resumed.optimize()
        save_weights(resumed, output)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
