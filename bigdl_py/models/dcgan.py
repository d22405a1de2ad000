"""A DCGAN (Radford et al. 2015) for 28x28 grey images: convolutional generator and discriminator.

The networks follow the paper's rules: no pooling (strided convolutions down, transposed
convolutions up), batch norm in both networks except the generator's output and the
discriminator's input layer, ReLU in the generator with a ``Tanh`` output, LeakyReLU(0.2) in
the discriminator, weights from ``N(0, 0.02)`` and batch-norm scales from ``N(1, 0.02)``.
Sized for Fashion-MNIST (``bigdl_py.models.gan``'s image shape): the generator grows
``1x1 -> 7x7 -> 14x14 -> 28x28``, the discriminator shrinks ``28 -> 14 -> 7 -> 1``.

:func:`dcgan` returns a :class:`~bigdl_py.models.gan.GAN`, so the same training steps
(``discriminator_step``, ``generator_step``) and ``jobs/train_gan.py --model dcgan`` train it.
"""

from __future__ import annotations

from bigdl_py import nn
from bigdl_py.models.gan import GAN, IMAGE_SHAPE, NOISE_SIZE

WEIGHT_STD = 0.02
CHANNELS = IMAGE_SHAPE[0]


def _dcgan_init(network: nn.Module) -> nn.Module:
    """The paper's initialisation, in place; returns ``network``."""
    for module in network.modules():
        if isinstance(module, (nn.Conv2d, nn.ConvTranspose2d)):
            nn.init.normal_(module.weight, std=WEIGHT_STD)
        elif isinstance(module, nn.BatchNorm2d):
            nn.init.normal_(module.weight, mean=1.0, std=WEIGHT_STD)
            nn.init.zeros_(module.bias)
    return network


def dcgan_generator(noise_size: int = NOISE_SIZE, width: int = 32) -> nn.Sequential:
    """Noise ``(N, noise_size)`` -> images ``(N, 1, 28, 28)`` in [-1, 1].

    ``width`` is the channel count before the last up-sampling (the first has ``4 * width``).
    """
    return _dcgan_init(
        nn.Sequential(
            nn.Reshape((noise_size, 1, 1)),
            nn.ConvTranspose2d(noise_size, 4 * width, 7, bias=False),  # 1x1 -> 7x7
            nn.BatchNorm2d(4 * width),
            nn.ReLU(),
            nn.ConvTranspose2d(4 * width, 2 * width, 4, 2, 1, bias=False),  # -> 14x14
            nn.BatchNorm2d(2 * width),
            nn.ReLU(),
            nn.ConvTranspose2d(2 * width, CHANNELS, 4, 2, 1, bias=False),  # -> 28x28
            nn.Tanh(),
        )
    )


def dcgan_discriminator(width: int = 32) -> nn.Sequential:
    """Images ``(N, 1, 28, 28)`` -> one logit each ``(N, 1)``: large means real."""
    return _dcgan_init(
        nn.Sequential(
            nn.Conv2d(CHANNELS, width, 4, 2, 1, bias=False),  # 28 -> 14
            nn.LeakyReLU(0.2),
            nn.Conv2d(width, 2 * width, 4, 2, 1, bias=False),  # -> 7
            nn.BatchNorm2d(2 * width),
            nn.LeakyReLU(0.2),
            nn.Conv2d(2 * width, 1, 7, bias=False),  # -> 1x1
            nn.Flatten(),
        )
    )


def dcgan(noise_size: int = NOISE_SIZE, width: int = 32) -> GAN:
    """A DCGAN generator and discriminator as one :class:`~bigdl_py.models.gan.GAN`."""
    return GAN(dcgan_generator(noise_size, width), dcgan_discriminator(width), noise_size)
