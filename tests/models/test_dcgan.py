"""The DCGAN networks: shapes, the paper's initialisation, training steps, save/load, the job."""

from __future__ import annotations

import os

import numpy as np
import pytest

from bigdl_py import nn
from bigdl_py.autograd import Tensor
from bigdl_py.models.dcgan import dcgan, dcgan_discriminator, dcgan_generator
from bigdl_py.models.gan import GAN

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def noise(rng):
    return rng.standard_normal((4, 16)).astype(np.float32)


def test_generator_makes_28x28_images_in_the_tanh_range(noise):
    images = dcgan_generator(noise_size=16, width=4)(Tensor(noise)).numpy()
    assert images.shape == (4, 1, 28, 28)
    assert np.all(np.abs(images) <= 1) and images.std() > 0


def test_discriminator_gives_one_logit_per_image(rng):
    images = rng.uniform(-1, 1, size=(3, 1, 28, 28)).astype(np.float32)
    assert dcgan_discriminator(width=4)(Tensor(images)).shape == (3, 1)


def test_weights_follow_the_papers_initialisation():
    network = dcgan_generator(noise_size=16, width=8)
    weights = np.concatenate([network[1].weight.numpy().ravel(), network[4].weight.numpy().ravel()])
    assert abs(weights.std() - 0.02) < 0.002 and abs(weights.mean()) < 0.002
    scales = network[2].weight.numpy()
    assert abs(scales.mean() - 1.0) < 0.02 and network[2].bias.numpy().max() == 0


def test_training_steps_lower_both_losses(rng, noise, sgd_losses):
    gan = dcgan(noise_size=16, width=4)
    real = rng.uniform(-1, 1, size=(4, 1, 28, 28)).astype(np.float32)
    bce = nn.BCEWithLogitsLoss()
    ones, zeros = np.ones((4, 1), np.float32), np.zeros((4, 1), np.float32)
    fake = gan.generator(Tensor(noise)).detach()

    def discriminator_loss(discriminator):
        return bce(discriminator(Tensor(real)), ones) + bce(discriminator(fake), zeros)

    losses = sgd_losses(gan.discriminator, discriminator_loss, steps=3, lr=0.05)
    assert losses[-1] < losses[0]
    gan.discriminator.eval()  # a fixed critic for the generator's steps

    def generator_loss(generator):
        return bce(gan.discriminator(generator(Tensor(noise))), ones)

    losses = sgd_losses(gan.generator, generator_loss, steps=3, lr=0.05)
    assert losses[-1] < losses[0]


def test_save_load_round_trip(tmp_path, noise):
    gan = dcgan(noise_size=16, width=4)
    gan.generator(Tensor(noise))  # running statistics that differ from a fresh model's
    gan.eval()
    path = tmp_path / "dcgan.bigdl"
    nn.save(gan, path)
    loaded = nn.load(path)
    assert isinstance(loaded, GAN) and loaded.noise_size == 16
    np.testing.assert_array_equal(loaded(Tensor(noise)).numpy(), gan(Tensor(noise)).numpy())
