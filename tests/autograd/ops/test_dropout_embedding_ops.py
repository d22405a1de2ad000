"""dropout and embedding: gradients, semantics, PyTorch parity, errors."""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py.autograd import Tensor, gradcheck, ops


def test_dropout_gradient_with_a_fixed_generator(make_tensor):
    x = make_tensor(4, 5)
    assert gradcheck(lambda a: ops.dropout(a, 0.3, rng=np.random.default_rng(7)), [x])


def test_dropout_zeroes_and_scales_with_the_mask_it_saved():
    x = Tensor(np.ones((200, 50)), requires_grad=True, dtype=np.float32)
    output = ops.dropout(x, p=0.25, rng=np.random.default_rng(0))
    kept = output.numpy() != 0
    assert output.dtype == np.float32
    np.testing.assert_allclose(output.numpy()[kept], 1 / 0.75, rtol=1e-6)
    assert abs(kept.mean() - 0.75) < 0.02
    output.sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), output.numpy())


def test_dropout_is_the_identity_in_evaluation_or_with_p_zero():
    x = Tensor(np.ones(3), requires_grad=True)
    assert ops.dropout(x, 0.5, training=False) is x
    assert ops.dropout(x, 0.0) is x


def test_dropout_with_p_one_drops_everything():
    output = ops.dropout(Tensor(np.ones(10)), 1.0)
    np.testing.assert_array_equal(output.numpy(), np.zeros(10))


def test_dropout_default_generator_follows_manual_seed():
    x = Tensor(np.ones(100))
    ops.manual_seed(3)
    first = ops.dropout(x, 0.5).numpy()
    ops.manual_seed(3)
    np.testing.assert_array_equal(ops.dropout(x, 0.5).numpy(), first)


def test_a_thread_that_seeds_dropout_draws_its_own_stream():
    """Spark's one-task mode reseeds a replica per thread: each thread's masks must follow
    its own seed whatever the others draw meanwhile, and the main thread's stay its own."""
    import threading

    x = Tensor(np.ones(1000))
    ops.manual_seed(3)
    expected_main = ops.dropout(x, 0.5).numpy()
    ops.manual_seed(5)
    expected_thread = ops.dropout(x, 0.5).numpy()
    ops.manual_seed(3)
    drawn = {}

    def in_thread():
        ops.manual_seed(5)
        drawn["before"] = ops.dropout(x, 0.5).numpy()

    thread = threading.Thread(target=in_thread)
    thread.start()
    thread.join()
    np.testing.assert_array_equal(drawn["before"], expected_thread)
    np.testing.assert_array_equal(ops.dropout(x, 0.5).numpy(), expected_main)


@pytest.mark.parametrize("p", [-0.1, 1.5])
def test_dropout_rejects_a_bad_probability(p):
    with pytest.raises(ValueError, match=f"dropout: p must be in \\[0, 1\\], got {p}"):
        ops.dropout(Tensor(np.ones(3)), p)


def test_dropout_rejects_a_generator_of_the_wrong_kind():
    with pytest.raises(TypeError, match="dropout: rng must be a numpy.random.Generator"):
        ops.dropout(Tensor(np.ones(3)), 0.5, rng=np.random.RandomState(0))


def test_embedding_gradient_with_repeated_indices(make_tensor):
    indices = np.array([[0, 2, 0], [1, 3, 2]])
    assert gradcheck(lambda w: ops.embedding(indices, w), [make_tensor(4, 3)])


@pytest.mark.parametrize("padding_idx, padding_row", [(1, 1), (-1, 3)])
def test_embedding_padding_row_gets_no_gradient(padding_idx, padding_row):
    indices = np.array([[0, 1, 3], [1, 3, 0]])
    weight = Tensor(np.ones((4, 2)), requires_grad=True)
    ops.embedding(indices, weight, padding_idx).sum().backward()
    expected = np.array([2.0, 2.0, 0.0, 2.0])[:, None] * np.ones((1, 2))
    expected[padding_row] = 0.0
    np.testing.assert_array_equal(weight.grad.numpy(), expected)


@pytest.mark.parametrize("padding_idx", [None, 2])
def test_embedding_matches_torch(torch, compare_with_torch, rng, padding_idx):
    indices = rng.integers(0, 6, size=(3, 4))
    compare_with_torch(
        lambda i, w: ops.embedding(i, w, padding_idx),
        lambda i, w: torch.nn.functional.embedding(i, w, padding_idx),
        [indices, rng.standard_normal((6, 5))],
    )


def test_embedding_accepts_index_tensors_and_lists():
    weight = Tensor(np.arange(6.0).reshape(3, 2), requires_grad=True)
    from_tensor = ops.embedding(Tensor(np.array([2, 0])), weight)
    from_list = ops.embedding([2, 0], weight)
    np.testing.assert_array_equal(from_tensor.numpy(), [[4.0, 5.0], [0.0, 1.0]])
    np.testing.assert_array_equal(from_list.numpy(), from_tensor.numpy())


@pytest.mark.parametrize(
    "indices, error, message",
    [
        (
            np.array([0, 5, 9]),
            IndexError,
            r"embedding: indices must be in \[0, 4\] for a vocabulary of 5 rows, "
            r"got min 0 and max 9",
        ),
        (np.array([-1, 2]), IndexError, r"got min -1 and max 2"),
        (np.array([0.0, 1.0]), TypeError, r"embedding: indices must be integers, got dtype"),
    ],
)
def test_embedding_errors(indices, error, message):
    with pytest.raises(error, match=message):
        ops.embedding(indices, Tensor(np.zeros((5, 2)), requires_grad=True))


def test_embedding_rejects_a_padding_index_outside_the_vocabulary():
    with pytest.raises(ValueError, match="embedding: padding_idx 5 is outside a vocabulary of 5"):
        ops.embedding(np.array([0]), Tensor(np.zeros((5, 2))), padding_idx=5)


# The weight gradient reaches the engine as rows and their indices (engine.RowGradient): a
# leaf adds them into its .grad in place; a sum with another gradient or a Function gets a
# dense array. Each case below against the dense gradient worked out by hand.


def test_embedding_gradients_accumulate_in_place_into_an_existing_grad():
    indices = np.array([3, 0, 3, 1])
    weight = Tensor(np.ones((5, 2), dtype=np.float32), requires_grad=True)
    ops.embedding(indices, weight).sum().backward()
    held = weight.grad.data  # as a flat gradient buffer's view would be
    ops.embedding(indices, weight).sum().backward()
    assert weight.grad.data is held
    np.testing.assert_array_equal(held[:, 0], [2.0, 2.0, 0.0, 4.0, 0.0])


def test_a_table_used_by_an_embedding_and_a_matmul_gets_both_gradients():
    rng = np.random.default_rng(0)
    table = rng.standard_normal((4, 3))
    weight = Tensor(table, requires_grad=True)
    indices = np.array([1, 1, 2])
    (ops.embedding(indices, weight).sum() + (weight @ np.ones(3)).sum()).backward()
    expected = np.ones((4, 3))
    expected[1] += 2.0
    expected[2] += 1.0
    np.testing.assert_allclose(weight.grad.numpy(), expected)


def test_an_embedding_of_a_computed_table_passes_a_dense_gradient_back():
    weight = Tensor(np.ones((3, 2)), requires_grad=True)
    ops.embedding(np.array([0, 0, 2]), weight * 3.0).sum().backward()
    np.testing.assert_allclose(weight.grad.numpy()[:, 0], [6.0, 0.0, 3.0])
