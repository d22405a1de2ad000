"""DistriTrainer: two models, two optimizers, custom steps, on DistriOptimizer's machinery.

The reference is written out by hand in this process, without any of bigdl_py's training
code: for each step, the gradient of the global batch's mean loss (partition j's share
weighted by its size, its noise from its own stream) on the trained part only, and plain
SGD. Alternating discriminator and generator steps on Spark must equal it to float
tolerance: the frozen part really is frozen and its current values really reach the
replicas every step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib

import numpy as np
import pytest
from background_jobs import beside_the_suite

from bigdl_py import backend, nn
from bigdl_py.autograd import Tensor
from bigdl_py.data.sample import split_bounds
from bigdl_py.models.gan import discriminator_step, generator_step, mlp_gan
from bigdl_py.optim import SGD, Adam
from bigdl_py.spark.distri_trainer import DistriTrainer, StepBatch

pytestmark = pytest.mark.spark

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
IMAGES, BATCH, NOISE, HIDDEN, LR, SEED = 90, 20, 4, 8, 0.05, 3
CPU = backend.device("cpu")
STEPS = {"discriminator": discriminator_step, "generator": generator_step}


def small_gan():
    with nn.init.seeded(2):
        return mlp_gan(NOISE, HIDDEN)


def images():
    generator = np.random.default_rng(0)
    return np.tanh(generator.normal(size=(IMAGES, 1, 28, 28))).astype(np.float32)


def parameters_of(model, prefix):
    return {
        name: parameter
        for name, parameter in model.named_parameters()
        if name.startswith(prefix + ".")
    }


def reference_step(gan, name, features, plan, epoch, batch, step_number):
    """One step ``name`` by hand: summed share gradients, then w -= LR * g on its part."""
    trained = parameters_of(gan, name)
    for parameter_name, parameter in gan.named_parameters():
        parameter.requires_grad_(parameter_name in trained)
        parameter.grad = None
    plan_iteration = epoch * plan.iterations_per_epoch + batch
    total = 0.0
    bounds = split_bounds(len(features), plan.num_partitions)
    for partition, (start, _) in enumerate(bounds):
        local = plan.local_indices(partition, plan_iteration)
        rng = np.random.default_rng([SEED, partition, step_number, zlib.crc32(name.encode()), 0])
        inputs = [Tensor(features[start + local])]
        share = StepBatch(inputs, np.zeros(len(local)), rng, CPU, partition, step_number)
        loss = STEPS[name](gan, share)
        (loss * (len(local) / BATCH)).backward()
        total += loss.item() * len(local)
    for parameter in trained.values():
        parameter.data[...] -= LR * parameter.grad.numpy()
    return total / BATCH


@pytest.mark.parametrize("num_partitions", [1, 3])
def test_alternating_steps_on_spark_equal_the_same_steps_by_hand(spark, num_partitions):
    features = images()
    distributed, reference = small_gan(), small_gan()
    with DistriTrainer(
        distributed,
        (features, np.zeros(IMAGES, dtype=np.int64)),
        BATCH,
        num_partitions=num_partitions,
        seed=SEED,
        spark=spark,
    ) as trainer:
        trainer.add_step("discriminator", discriminator_step, SGD(lr=LR), "discriminator")
        trainer.add_step("generator", generator_step, SGD(lr=LR), "generator")
        losses, expected_losses = [], []
        schedule = [(0, 0), (0, 1), (1, 0)]  # (epoch, batch): crosses an epoch boundary
        for step_number, (epoch, batch) in enumerate(schedule):
            for name in ("discriminator", "generator"):
                losses.append(trainer.run_step(name, epoch, batch)["loss"])
                expected_losses.append(
                    reference_step(
                        reference, name, features, trainer.plan, epoch, batch, step_number
                    )
                )
        trainer.sync_model()
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-5)
    for (name, ours), (_, theirs) in zip(
        distributed.named_parameters(), reference.named_parameters(), strict=True
    ):
        np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-5, atol=1e-6, err_msg=name)
    # Both parts moved: neither step was a no-op.
    initial = small_gan()
    for prefix in ("generator", "discriminator"):
        moved = [
            not np.allclose(p.numpy(), parameters_of(initial, prefix)[n].numpy())
            for n, p in parameters_of(distributed, prefix).items()
        ]
        assert all(moved), prefix


def gan_trainer(spark, model, batch_size=BATCH):
    trainer = DistriTrainer(
        model,
        (images(), np.zeros(IMAGES, dtype=np.int64)),
        batch_size,
        num_partitions=2,
        seed=SEED,
        spark=spark,
    )
    trainer.add_step("discriminator", discriminator_step, Adam(lr=0.01), "discriminator")
    trainer.add_step("generator", generator_step, Adam(lr=0.01), "generator")
    return trainer


def run_schedule(trainer, schedule):
    for epoch, batch in schedule:
        for name in ("discriminator", "generator"):
            trainer.run_step(name, epoch, batch)


def test_checkpoint_and_resume_in_a_new_trainer_is_exact(spark, tmp_path):
    """Weights, both Adams' sharded moments and the step counts (which fix the noise)
    survive a checkpoint: stopping after two batches and resuming in a new trainer over a
    freshly initialised model gives bit-identical weights."""
    schedule = [(0, 0), (0, 1), (0, 2), (1, 0)]
    straight = small_gan()
    with gan_trainer(spark, straight) as trainer:
        run_schedule(trainer, schedule)
        trainer.sync_model()
    with gan_trainer(spark, small_gan()) as trainer:
        run_schedule(trainer, schedule[:2])
        trainer.save_checkpoint(str(tmp_path), {"epoch": 0, "next_batch": 2})
    with nn.init.seeded(99):
        resumed = mlp_gan(NOISE, HIDDEN)  # other weights: all must come from the checkpoint
    with gan_trainer(spark, resumed) as trainer:
        assert trainer.load_checkpoint(str(tmp_path)) == {"epoch": 0, "next_batch": 2}
        run_schedule(trainer, schedule[2:])
        trainer.sync_model()
    for (name, ours), (_, theirs) in zip(
        resumed.named_parameters(), straight.named_parameters(), strict=True
    ):
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy(), err_msg=name)
    with gan_trainer(spark, small_gan(), batch_size=BATCH + 2) as trainer:
        with pytest.raises(ValueError, match="batch_size.*20, 22"):
            trainer.load_checkpoint(str(tmp_path))


def test_a_fresh_trainer_never_replaces_another_runs_checkpoints(spark, tmp_path):
    """Checkpoints record their run: a new trainer saving into that directory is refused
    (naming the other run) and leaves it as it was, unless told to replace them; a trainer
    resumed from it continues that run and saves there."""
    from bigdl_py.train import list_checkpoints

    with gan_trainer(spark, small_gan()) as first:
        run_schedule(first, [(0, 0)])
        first.save_checkpoint(str(tmp_path), {"epoch": 0})
    kept = list_checkpoints(tmp_path)
    with gan_trainer(spark, small_gan()) as fresh:
        with pytest.raises(ValueError, match=rf"another run \({first.run_id};"):
            fresh.save_checkpoint(str(tmp_path), {"epoch": 0})
        assert list_checkpoints(tmp_path) == kept
        fresh.save_checkpoint(str(tmp_path), {"epoch": 0}, replace_other_runs=True)
    with gan_trainer(spark, small_gan()) as resumed:
        resumed.load_checkpoint(str(tmp_path))
        assert resumed.run_id == fresh.run_id
        resumed.save_checkpoint(str(tmp_path), {"epoch": 1})  # its own run: allowed


def test_bad_steps_fail_clearly(spark):
    gan = small_gan()
    with DistriTrainer(
        gan, (images(), np.zeros(IMAGES, dtype=np.int64)), BATCH, num_partitions=2, spark=spark
    ) as trainer:
        with pytest.raises(ValueError, match="no submodule 'critic'.*discriminator"):
            trainer.add_step("critic", discriminator_step, SGD(lr=LR), "critic")
        trainer.add_step("generator", generator_step, SGD(lr=LR), "generator")
        with pytest.raises(ValueError, match="exists already"):
            trainer.add_step("generator", generator_step, SGD(lr=LR), "generator")
        with pytest.raises(KeyError, match="no step named 'discriminator'"):
            trainer.run_step("discriminator", 0, 0)
        last = trainer.batches_per_epoch
        with pytest.raises(ValueError, match=rf"batch must be in \[0, {last}\)"):
            trainer.run_step("generator", 0, last)
        with pytest.raises(TypeError, match="OptimMethod"):
            trainer.add_step("other", generator_step, "adam", "discriminator")
    with pytest.raises(ValueError, match="batch_size 1 is smaller than num_partitions 2"):
        DistriTrainer(gan, (images(), np.zeros(IMAGES)), 1, num_partitions=2, spark=spark)


@pytest.mark.slow
@beside_the_suite(timeout=1200)
def test_gan_job_smoke_trains_resumes_writes_sample_grids_and_a_loadable_model(tmp_path):
    """jobs/train_gan.py as a user runs it: the DCGAN (its convolutional generator and
    discriminator; the MLP GAN's steps are the in-process tests above) for a few iterations
    on real Fashion-MNIST, stopped after one epoch and resumed from its checkpoint in a
    second process."""
    from matplotlib.image import imread

    from bigdl_py.data import find_fashion_mnist

    try:
        find_fashion_mnist("train")
    except FileNotFoundError as error:
        pytest.skip(str(error))
    output = tmp_path / "gan"

    def run_job(epochs, *extra):
        command = [sys.executable, os.path.join(REPO, "jobs", "train_gan.py"), "--model", "dcgan"]
        command += ["--master", "local[2]", "--limit", "128", "--epochs", str(epochs)]
        command += ["--batch-size", "64", "--hidden", "4", "--output", str(output)]
        command += ["--log-every", "2", "--checkpoint-dir", str(tmp_path / "checkpoints")]
        completed = subprocess.run(
            command + list(extra), capture_output=True, text=True, timeout=600, check=False
        )
        assert completed.returncode == 0, completed.stderr[-3000:]
        return completed

    run_job(1)  # one epoch, checkpointed; then a new process resumes for the second
    completed = run_job(2, "--resume")
    assert "resumed after epoch 1" in completed.stdout
    assert "epoch 2: mean D loss" in completed.stdout

    history = json.loads((output / "history.json").read_text())
    assert history["epochs"] == [1, 2]
    losses = history["discriminator_loss"] + history["generator_loss"]
    assert all(np.isfinite(losses)) and all(loss > 0 for loss in losses)
    for epoch in (1, 2):
        grid = imread(output / f"samples-epoch-{epoch}.png")
        assert grid.shape[:2] == (8 * 30 + 2, 8 * 30 + 2)  # 8x8 images of 28 + 2 px borders
        assert grid[..., 0].std() > 0.01  # not a blank picture
    gan = nn.load(str(output / "gan.bigdl"))
    assert isinstance(gan.generator[1], nn.ConvTranspose2d)
    samples = gan(Tensor(np.zeros((2, gan.noise_size), dtype=np.float32))).numpy()
    assert samples.shape == (2, 1, 28, 28) and np.all(np.abs(samples) <= 1)
