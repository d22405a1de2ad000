"""Train a GAN on Fashion-MNIST on Spark: two models, two optimizers, custom training steps.

A generator and a discriminator (``bigdl_py.models.gan``) are trained alternately with
``bigdl_py.spark.DistriTrainer``: each global batch, one synchronous discriminator step
(real images against generated ones, its own Adam) and one generator step (fool the frozen
discriminator, its own Adam), each one Spark job over the cached partitions with the
gradient AllReduce of DistriOptimizer. Runs with plain Python (local mode) or spark-submit:

    python jobs/train_gan.py --epochs 5
    python jobs/train_gan.py --model dcgan       # convolutional networks (Radford et al.)
    spark-submit --master spark://host:7077 --properties-file conf/spark-defaults.conf \\
        --py-files dist/bigdl_py.zip jobs/train_gan.py --partitions 4

It prints the two losses as it goes and writes into ``--output`` (default ``runs/gan``): a
PNG grid of 64 generated samples after every epoch (``samples-epoch-N.png``, always from the
same noise, so the grids show the generator learning), the trained GAN (``gan.bigdl``) and
the loss history (``history.json``). ``--checkpoint-dir`` keeps a checkpoint after every
epoch (weights, both optimizers' sharded state; atomic, no pickle) and ``--resume``
continues from the newest one there.

The output folder appears only when the run completes (it is written as ``.gan.partial``
beside it until then); an existing one is replaced only with ``--overwrite`` (or continued
with ``--resume``), and whole, so no sample grid of an earlier run stays beside the new ones.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

# Runnable from a source checkout without installing (spark-submit puts only jobs/ on the path).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import output_checks  # noqa: E402
from argument_types import real_number, whole_number  # noqa: E402
from training_arguments import (  # noqa: E402
    add_training_arguments,
    check_training_arguments,
    run_output,
)

from bigdl_py import nn  # noqa: E402
from bigdl_py.autograd import Tensor, no_grad  # noqa: E402
from bigdl_py.data import fashion_mnist_raw  # noqa: E402
from bigdl_py.models.dcgan import dcgan  # noqa: E402
from bigdl_py.models.gan import (  # noqa: E402
    discriminator_step,
    generator_step,
    mlp_gan,
    to_gan_range,
)
from bigdl_py.nn.serialization import atomic_write  # noqa: E402
from bigdl_py.optim import Adam  # noqa: E402
from bigdl_py.spark.distri_trainer import DistriTrainer  # noqa: E402
from bigdl_py.spark.session import get_spark, task_slots  # noqa: E402
from bigdl_py.train import save_image_grid  # noqa: E402

SAMPLES_IN_GRID = 64
# What the job writes into --output; an existing --output holding anything else is refused.
WRITES = ("gan.bigdl", "history.json", "samples-epoch-*.png")


def parse_arguments(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_training_arguments(parser, epochs=5, output="runs/gan")
    parser.add_argument(
        "--lr", type=real_number(0), default=2e-4, help="Adam's rate, both networks"
    )
    parser.add_argument(
        "--beta1",
        type=real_number(0, 1, high_open=True),
        default=0.5,
        help="Adam's beta1, both networks",
    )
    parser.add_argument(
        "--noise-size", type=whole_number(1), default=64, help="the generator's input size"
    )
    parser.add_argument(
        "--model",
        choices=("mlp", "dcgan"),
        default="mlp",
        help="mlp: fully connected networks; dcgan: strided and transposed convolutions",
    )
    parser.add_argument(
        "--hidden",
        type=whole_number(1),
        default=None,
        help="width of the networks: mlp's hidden units (default 256), dcgan's base channel "
        "count (default 32)",
    )
    parser.add_argument(
        "--log-every", type=whole_number(1), default=50, help="print every N batches"
    )
    arguments = check_training_arguments(
        parser,
        parser.parse_args(argv),
        writes=WRITES,
        kind=output_checks.TRAINER_RUN,
        fashion_mnist=("train",),
    )
    if arguments.hidden is None:
        arguments.hidden = 256 if arguments.model == "mlp" else 32
    return arguments


def generate(gan, noise: np.ndarray) -> np.ndarray:
    gan.eval()
    with no_grad():
        images = gan(Tensor(noise)).numpy()
    gan.train()
    return images


def main(argv=None) -> dict:
    arguments = parse_arguments(argv)
    started = time.perf_counter()
    spark = get_spark(arguments.master, app_name="bigdl_py GAN Fashion-MNIST")
    spark.sparkContext.setLogLevel("WARN")
    with run_output(arguments) as output:
        history = train(arguments, spark, output)
    minutes = (time.perf_counter() - started) / 60
    model_path = os.path.join(arguments.output, "gan.bigdl")
    history_path = os.path.join(arguments.output, "history.json")
    print(f"trained in {minutes:.1f} min; model: {model_path}; history: {history_path}")
    spark.stop()
    return history


def train(arguments: argparse.Namespace, spark, output: str) -> dict:
    """Train the GAN; its sample grids, model and history go into the folder ``output``."""
    images, labels = fashion_mnist_raw("train", arguments.data)
    if arguments.limit is not None:
        images, labels = images[: arguments.limit], labels[: arguments.limit]
    partitions = arguments.partitions or task_slots(spark.sparkContext)
    print(
        f"Fashion-MNIST: {len(labels)} training images; {partitions} partitions on "
        f"{spark.sparkContext.master}",
        flush=True,
    )

    nn.init.manual_seed(arguments.seed)
    build = mlp_gan if arguments.model == "mlp" else dcgan
    gan = build(arguments.noise_size, arguments.hidden)
    fixed_noise = np.random.default_rng(arguments.seed).standard_normal(
        (SAMPLES_IN_GRID, arguments.noise_size), dtype=np.float32
    )
    history: dict = {"epochs": [], "discriminator_loss": [], "generator_loss": []}
    trainer = DistriTrainer(
        gan,
        (to_gan_range(images), labels),
        arguments.batch_size,
        num_partitions=partitions,
        seed=arguments.seed,
        device=arguments.device,
        spark=spark,
    )
    try:
        adam = dict(lr=arguments.lr, betas=(arguments.beta1, 0.999))
        trainer.add_step("discriminator", discriminator_step, Adam(**adam), "discriminator")
        trainer.add_step("generator", generator_step, Adam(**adam), "generator")
        first_epoch = 0
        if arguments.resume:
            resumed = trainer.load_checkpoint(arguments.checkpoint_dir)
            first_epoch, history = resumed["epoch"], resumed["history"]
            print(f"resumed after epoch {first_epoch} from {arguments.checkpoint_dir}")
        batches = trainer.batches_per_epoch
        for epoch in range(first_epoch, arguments.epochs):
            epoch_started = time.perf_counter()
            d_losses, g_losses = [], []
            for batch in range(batches):
                d_losses.append(trainer.run_step("discriminator", epoch, batch)["loss"])
                g_losses.append(trainer.run_step("generator", epoch, batch)["loss"])
                if (batch + 1) % arguments.log_every == 0 or batch + 1 == batches:
                    seconds = time.perf_counter() - epoch_started
                    print(
                        f"[Epoch {epoch + 1}/{arguments.epochs} batch {batch + 1}/{batches}] "
                        f"D loss {d_losses[-1]:.4f}, G loss {g_losses[-1]:.4f}, "
                        f"{(batch + 1) * arguments.batch_size / seconds:.1f} images/s",
                        flush=True,
                    )
            if not all(math.isfinite(loss) for loss in d_losses + g_losses):
                raise RuntimeError(
                    f"epoch {epoch + 1}: a loss was not finite (D {d_losses[-1]}, "
                    f"G {g_losses[-1]}); lower --lr"
                )
            trainer.sync_model()
            grid = save_image_grid(
                generate(gan, fixed_noise),
                os.path.join(output, f"samples-epoch-{epoch + 1}.png"),
            )
            history["epochs"].append(epoch + 1)
            history["discriminator_loss"].append(float(np.mean(d_losses)))
            history["generator_loss"].append(float(np.mean(g_losses)))
            print(
                f"epoch {epoch + 1}: mean D loss {history['discriminator_loss'][-1]:.4f}, "
                f"mean G loss {history['generator_loss'][-1]:.4f}; samples: {grid}",
                flush=True,
            )
            if arguments.checkpoint_dir:
                trainer.save_checkpoint(
                    arguments.checkpoint_dir,
                    {"epoch": epoch + 1, "history": history},
                    replace_other_runs=arguments.overwrite_checkpoints,
                )
    finally:
        trainer.close()

    nn.save(gan, os.path.join(output, "gan.bigdl"))
    text = json.dumps(history, indent=1).encode("utf-8")
    atomic_write(os.path.join(output, "history.json"), lambda file: file.write(text))
    return history


if __name__ == "__main__":
    main()
