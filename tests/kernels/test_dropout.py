"""Dropout on a device from Philox4x32-10 with its state on the device (the references on
the strict device): the generator's known answer, the mask's rate, the backward's reuse of
the forward's mask, and seeding."""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py import backend, device_waits
from bigdl_py.autograd import Tensor, ops
from bigdl_py.kernels import dropout as fused_dropout


def test_philox_gives_random123s_known_answer():
    # philox4x32_10, counter {0, 0, 0, 0}, key {0, 0}: Random123's kat_vectors.
    words = fused_dropout.philox_words(np.array([0, 0], np.uint64), 1)[0]
    assert [int(word) for word in words] == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]


def test_a_stream_moves_past_each_draw_and_the_host_reads_nothing():
    ops.manual_seed(5)
    x = Tensor(np.ones((64, 50), np.float32), device="strict", requires_grad=True)
    with device_waits.no_device_waits():
        first = ops.dropout(x, 0.3)
        second = ops.dropout(x, 0.3)
        (first * 2 + second).sum().backward()
    first, second = first.numpy(), second.numpy()
    assert not np.array_equal(first == 0, second == 0)
    scale = np.float32(1 / 0.7)
    for output in (first, second):
        assert set(np.unique(output)) <= {0, scale}
        assert abs((output == 0).mean() - 0.3) < 0.03  # 3,200 draws: ~4 standard deviations
    # Each backward regenerates its forward's mask: the gradient is zero where it dropped.
    np.testing.assert_allclose(x.grad.numpy(), 2 * first + second, rtol=1e-6)


def test_manual_seed_makes_device_masks_repeat():
    x = Tensor(np.ones(1000, np.float32), device="strict")
    masks = []
    for _ in range(2):
        ops.manual_seed(11)
        masks.append(ops.dropout(x, 0.5).numpy() == 0)
    np.testing.assert_array_equal(masks[0], masks[1])


@pytest.mark.parametrize("p", [0.0, 1.0])
def test_the_rates_at_the_ends_keep_all_or_nothing(p):
    x = Tensor(np.ones(101, np.float32), device="strict")
    expected = np.ones(101) if p == 0 else np.zeros(101)
    np.testing.assert_array_equal(ops.dropout(x, p).numpy(), expected)


def test_attention_dropout_draws_its_mask_on_the_device():
    rng = np.random.default_rng(0)
    q, k, v = (Tensor(rng.standard_normal((2, 5, 4)).astype(np.float32), device="strict")
               for _ in range(3))  # fmt: skip
    with device_waits.no_device_waits():
        out = ops.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    assert out.shape == (2, 5, 4) and backend.device_of(out.data) == backend.STRICT


def test_manual_seed_reseeds_a_stream_in_place_and_leaves_the_host_draws_alone():
    x = Tensor(np.ones(1000, np.float32), device="strict")
    ops.manual_seed(11)
    first = ops.dropout(x, 0.5).numpy()
    state = fused_dropout._stream(x.data)
    ops.manual_seed(11)
    # The same device memory (a captured step keeps reading it), a stream started again.
    assert fused_dropout._stream(x.data) is state
    np.testing.assert_array_equal(ops.dropout(x, 0.5).numpy(), first)
    from bigdl_py.autograd.ops.misc import default_generator

    ops.manual_seed(11)
    np.testing.assert_array_equal(
        default_generator().random(5), np.random.default_rng(11).random(5)
    )
