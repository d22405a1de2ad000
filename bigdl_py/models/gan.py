"""A GAN for 28x28 grey images: the two networks, and the two training steps.

Goodfellow et al.'s GAN with fully connected networks (LeakyReLU in the discriminator and
the generator, ``Tanh`` images in [-1, 1]) and the non-saturating generator loss. Both
networks are children of one :class:`GAN` module so that a ``DistriTrainer`` can ship them
together and train each with its own step and optimizer:

* :func:`discriminator_step`: real images labelled 1, generated ones labelled 0; the
  generator is frozen in this step, so nothing flows back into it;
* :func:`generator_step`: generated images the (frozen) discriminator should call real.

The steps are plain functions of ``(gan, batch)``, with ``batch`` a
:class:`~bigdl_py.spark.replica.StepBatch` (its ``inputs``, and ``normal`` to
draw the noise), so they run the same on Spark executors and in a test without Spark.
"""

from __future__ import annotations

import numpy as np

from bigdl_py import backend, nn
from bigdl_py.autograd import Tensor

NOISE_SIZE = 64
IMAGE_SHAPE = (1, 28, 28)


def mlp_generator(noise_size: int = NOISE_SIZE, hidden: int = 256) -> nn.Sequential:
    """Noise ``(N, noise_size)`` -> images ``(N, 1, 28, 28)`` in [-1, 1]."""
    pixels = int(np.prod(IMAGE_SHAPE))
    return nn.Sequential(
        nn.Linear(noise_size, hidden),
        nn.LeakyReLU(0.2),
        nn.Linear(hidden, 2 * hidden),
        nn.LeakyReLU(0.2),
        nn.Linear(2 * hidden, pixels),
        nn.Tanh(),
        nn.Reshape(IMAGE_SHAPE),
    )


def mlp_discriminator(hidden: int = 256) -> nn.Sequential:
    """Images ``(N, 1, 28, 28)`` -> one logit each ``(N, 1)``: large means real."""
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(int(np.prod(IMAGE_SHAPE)), 2 * hidden),
        nn.LeakyReLU(0.2),
        nn.Linear(2 * hidden, hidden),
        nn.LeakyReLU(0.2),
        nn.Linear(hidden, 1),
    )


class GAN(nn.Module):
    """A generator and a discriminator as one module; calling it generates images."""

    def __init__(self, generator: nn.Module, discriminator: nn.Module, noise_size: int):
        super().__init__()
        self.generator = generator
        self.discriminator = discriminator
        self.noise_size = int(noise_size)

    def forward(self, noise):
        return self.generator(noise)


# Known to bigdl_py.nn.save/load by name (the safe format names classes, never pickles them).
nn.register_module(GAN)


def mlp_gan(noise_size: int = NOISE_SIZE, hidden: int = 256) -> GAN:
    return GAN(mlp_generator(noise_size, hidden), mlp_discriminator(hidden), noise_size)


def _targets(count: int, value: float, like: Tensor) -> np.ndarray:
    """A column of ``value`` for ``count`` logits, on the logits' device."""
    return backend.to_device(np.full((count, 1), value, dtype=np.float32), like.device)


def discriminator_step(gan: GAN, batch) -> Tensor:
    """Mean over the batch of -log D(real) - log(1 - D(G(noise)))."""
    loss = nn.BCEWithLogitsLoss()
    real = batch.inputs[0]
    count = len(batch)
    fake = gan.generator(batch.normal(count, gan.noise_size))
    real_logits = gan.discriminator(real)
    fake_logits = gan.discriminator(fake)
    return loss(real_logits, _targets(count, 1.0, real_logits)) + loss(
        fake_logits, _targets(count, 0.0, fake_logits)
    )


def generator_step(gan: GAN, batch) -> Tensor:
    """Mean over the batch of -log D(G(noise)): the non-saturating generator loss."""
    count = len(batch)
    logits = gan.discriminator(gan.generator(batch.normal(count, gan.noise_size)))
    return nn.BCEWithLogitsLoss()(logits, _targets(count, 1.0, logits))


def to_gan_range(images: np.ndarray) -> np.ndarray:
    """uint8 images ``(N, 28, 28)`` -> float32 ``(N, 1, 28, 28)`` in [-1, 1] (the ``Tanh``
    range of the generator)."""
    images = np.asarray(images, dtype=np.float32)
    return (images / 127.5 - 1.0).reshape((-1, *IMAGE_SHAPE))
