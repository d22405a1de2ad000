"""The fused scaled dot-product attention op: finite differences, PyTorch parity, errors."""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py.autograd import Tensor, gradcheck, ops

F64 = np.float64


def arrays(seed=0):
    """query (2, 3, 4), key (2, 5, 4), value (2, 5, 2) and a float mask (3, 5)."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape) for shape in ((2, 3, 4), (2, 5, 4), (2, 5, 2), (3, 5))]


@pytest.mark.parametrize("dropout_p", [0.0, 0.5])
def test_gradients_match_finite_differences(dropout_p):
    *tensors, mask = arrays()
    inputs = [Tensor(a, requires_grad=True, dtype=F64) for a in tensors]

    def run(*_):
        ops.manual_seed(0)  # the same dropout mask on every call
        return ops.scaled_dot_product_attention(*inputs, mask, dropout_p)

    assert gradcheck(run, inputs)


def test_matches_pytorch(torch):
    *tensors, mask = arrays()
    ours = [Tensor(a, requires_grad=True, dtype=F64) for a in tensors]
    theirs = [torch.tensor(a, requires_grad=True) for a in tensors]
    our_output = ops.scaled_dot_product_attention(*ours, mask)
    their_output = torch.nn.functional.scaled_dot_product_attention(
        *theirs, attn_mask=torch.from_numpy(mask)
    )
    np.testing.assert_allclose(our_output.numpy(), their_output.detach().numpy(), rtol=1e-10)
    upstream = np.random.default_rng(1).standard_normal(our_output.shape)
    our_output.backward(upstream)
    their_output.backward(torch.from_numpy(upstream))
    for name, mine, reference in zip("qkv", ours, theirs, strict=True):
        np.testing.assert_allclose(
            mine.grad.numpy(), reference.grad.numpy(), rtol=1e-10, err_msg=f"gradient of {name}"
        )


def test_dropout_one_drops_everything():
    *tensors, _ = arrays()
    output = ops.scaled_dot_product_attention(
        *(Tensor(a, dtype=F64) for a in tensors), dropout_p=1.0
    )
    assert not output.numpy().any()


@pytest.mark.parametrize(
    "shapes, dropout_p, message",
    [
        (((2, 3, 4), (2, 5, 3), (2, 5, 2)), 0.0, r"got shapes \(2, 3, 4\), \(2, 5, 3\)"),
        (((2, 3, 4), (2, 5, 4), (2, 6, 2)), 0.0, "expects query"),
        (((2, 3, 4), (2, 5, 4), (2, 5, 2)), 1.5, "dropout_p must be in"),
    ],
    ids=["widths", "lengths", "dropout"],
)
def test_bad_inputs_are_refused(shapes, dropout_p, message):
    tensors = [Tensor(np.zeros(shape)) for shape in shapes]
    with pytest.raises(ValueError, match=message):
        ops.scaled_dot_product_attention(*tensors, dropout_p=dropout_p)
