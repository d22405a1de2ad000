"""Every layer against finite differences (float64) and against PyTorch.

One table of cases drives both checks. The PyTorch check copies our initial state into the
PyTorch layer with ``load_state_dict(strict=True)`` — so it also proves our parameter and
buffer names are PyTorch's — then compares the output, the input gradients, the parameter
gradients and the buffers after the step (running statistics), to 1e-5 relative.
"""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py import backend, nn
from bigdl_py.autograd import Tensor, gradcheck

F64 = np.float64


def with_random_running_stats(layer):
    """Give a batch-norm layer non-trivial running statistics (for evaluation-mode cases)."""
    rng = np.random.default_rng(7)
    layer.running_mean.data[...] = rng.standard_normal(layer.num_features)
    layer.running_var.data[...] = 0.5 + rng.random(layer.num_features)
    return layer


def with_random_affine(layer):
    """Scale and shift away from 1 and 0, so their gradients are tested in general position."""
    rng = np.random.default_rng(8)
    for parameter in layer.parameters():
        parameter.data[...] = rng.standard_normal(parameter.shape)
    return layer


def indices(shape, high):
    """An integer-input spec: indices in [0, high)."""
    return ("indices", shape, high)


# (id, our layer in float64, the PyTorch layer or function, input specs)
CASES = [
    ("linear", lambda: nn.Linear(5, 3, dtype=F64), lambda t: t.nn.Linear(5, 3), [(4, 5)]),
    (
        "linear_no_bias_3d_input",
        lambda: nn.Linear(4, 2, bias=False, dtype=F64),
        lambda t: t.nn.Linear(4, 2, bias=False),
        [(2, 3, 4)],
    ),
    (
        "conv2d",
        lambda: nn.Conv2d(2, 3, 3, dtype=F64),
        lambda t: t.nn.Conv2d(2, 3, 3),
        [(2, 2, 5, 5)],
    ),
    (
        "conv2d_stride_padding_dilation",
        lambda: nn.Conv2d(2, 2, (3, 2), stride=(2, 1), padding=1, dilation=(1, 2), dtype=F64),
        lambda t: t.nn.Conv2d(2, 2, (3, 2), stride=(2, 1), padding=1, dilation=(1, 2)),
        [(1, 2, 6, 5)],
    ),
    (
        "conv2d_groups_no_bias",
        lambda: nn.Conv2d(4, 2, 3, padding=1, groups=2, bias=False, dtype=F64),
        lambda t: t.nn.Conv2d(4, 2, 3, padding=1, groups=2, bias=False),
        [(1, 4, 4, 4)],
    ),
    ("max_pool2d", lambda: nn.MaxPool2d(2), lambda t: t.nn.MaxPool2d(2), [(2, 2, 4, 6)]),
    (
        "max_pool2d_overlapping_padded",
        lambda: nn.MaxPool2d(3, stride=2, padding=1),
        lambda t: t.nn.MaxPool2d(3, stride=2, padding=1),
        [(1, 2, 5, 5)],
    ),
    ("avg_pool2d", lambda: nn.AvgPool2d(2), lambda t: t.nn.AvgPool2d(2), [(2, 2, 4, 4)]),
    (
        "avg_pool2d_overlapping_padded",
        lambda: nn.AvgPool2d((3, 2), stride=1, padding=(1, 0)),
        lambda t: t.nn.AvgPool2d((3, 2), stride=1, padding=(1, 0)),
        [(1, 2, 4, 4)],
    ),
    (
        "batch_norm1d_train",
        lambda: with_random_affine(nn.BatchNorm1d(3, dtype=F64)),
        lambda t: t.nn.BatchNorm1d(3),
        [(6, 3)],
    ),
    (
        "batch_norm1d_train_3d_input",
        lambda: with_random_affine(nn.BatchNorm1d(2, momentum=0.3, dtype=F64)),
        lambda t: t.nn.BatchNorm1d(2, momentum=0.3),
        [(3, 2, 4)],
    ),
    (
        "batch_norm1d_cumulative_average",
        lambda: nn.BatchNorm1d(3, momentum=None, dtype=F64),
        lambda t: t.nn.BatchNorm1d(3, momentum=None),
        [(5, 3)],
    ),
    (
        "batch_norm1d_eval",
        lambda: with_random_running_stats(with_random_affine(nn.BatchNorm1d(3, dtype=F64))).eval(),
        lambda t: t.nn.BatchNorm1d(3),
        [(4, 3)],
    ),
    (
        "batch_norm2d_train",
        lambda: with_random_affine(nn.BatchNorm2d(3, dtype=F64)),
        lambda t: t.nn.BatchNorm2d(3),
        [(2, 3, 3, 3)],
    ),
    (
        "batch_norm2d_eval",
        lambda: with_random_running_stats(nn.BatchNorm2d(3, dtype=F64)).eval(),
        lambda t: t.nn.BatchNorm2d(3),
        [(2, 3, 2, 3)],
    ),
    (
        "batch_norm2d_no_affine",
        lambda: nn.BatchNorm2d(2, affine=False, dtype=F64),
        lambda t: t.nn.BatchNorm2d(2, affine=False),
        [(2, 2, 3, 3)],
    ),
    (
        "batch_norm2d_without_running_stats_in_eval",
        lambda: nn.BatchNorm2d(2, track_running_stats=False, dtype=F64).eval(),
        lambda t: t.nn.BatchNorm2d(2, track_running_stats=False),
        [(3, 2, 2, 2)],
    ),
    (
        "layer_norm",
        lambda: with_random_affine(nn.LayerNorm(5, dtype=F64)),
        lambda t: t.nn.LayerNorm(5),
        [(3, 5)],
    ),
    (
        "layer_norm_two_axes",
        lambda: with_random_affine(nn.LayerNorm((2, 3), dtype=F64)),
        lambda t: t.nn.LayerNorm((2, 3)),
        [(2, 4, 2, 3)],
    ),
    (
        "layer_norm_no_affine",
        lambda: nn.LayerNorm(4, elementwise_affine=False, dtype=F64),
        lambda t: t.nn.LayerNorm(4, elementwise_affine=False),
        [(3, 4)],
    ),
    ("relu", nn.ReLU, lambda t: t.nn.ReLU(), [(3, 4)]),
    ("leaky_relu", lambda: nn.LeakyReLU(0.2), lambda t: t.nn.LeakyReLU(0.2), [(3, 4)]),
    ("tanh", nn.Tanh, lambda t: t.nn.Tanh(), [(3, 4)]),
    ("sigmoid", nn.Sigmoid, lambda t: t.nn.Sigmoid(), [(3, 4)]),
    ("gelu", nn.GELU, lambda t: t.nn.GELU(), [(3, 4)]),
    ("gelu_tanh", lambda: nn.GELU("tanh"), lambda t: t.nn.GELU("tanh"), [(3, 4)]),
    ("softmax", nn.Softmax, lambda t: t.nn.Softmax(dim=-1), [(3, 4)]),
    ("softmax_dim1", lambda: nn.Softmax(dim=1), lambda t: t.nn.Softmax(dim=1), [(2, 3, 2)]),
    ("log_softmax", nn.LogSoftmax, lambda t: t.nn.LogSoftmax(dim=-1), [(3, 4)]),
    ("flatten", nn.Flatten, lambda t: t.nn.Flatten(), [(2, 3, 2, 2)]),
    (
        "flatten_middle_axes",
        lambda: nn.Flatten(1, 2),
        lambda t: t.nn.Flatten(1, 2),
        [(2, 3, 2, 2)],
    ),
    (
        "reshape",
        lambda: nn.Reshape((3, -1)),
        lambda t: lambda x: x.reshape(x.shape[0], 3, -1),
        [(2, 2, 6)],
    ),
    ("identity", nn.Identity, lambda t: t.nn.Identity(), [(2, 3)]),
    (
        "embedding",
        lambda: nn.Embedding(7, 3, dtype=F64),
        lambda t: t.nn.Embedding(7, 3),
        [indices((2, 5), 7)],
    ),
    (
        "embedding_padding_idx",
        lambda: nn.Embedding(6, 2, padding_idx=1, dtype=F64),
        lambda t: t.nn.Embedding(6, 2, padding_idx=1),
        [np.array([[1, 0, 1], [5, 1, 2]])],
    ),
    ("dropout_eval", lambda: nn.Dropout(0.5).eval(), lambda t: t.nn.Dropout(0.5), [(3, 4)]),
    ("dropout_p0", lambda: nn.Dropout(0.0), lambda t: t.nn.Dropout(0.0), [(3, 4)]),
    ("add", nn.Add, lambda t: lambda a, b, c: a + b + c, [(2, 3), (2, 3), (2, 3)]),
    ("multiply", nn.Multiply, lambda t: lambda a, b: a * b, [(2, 3), (2, 3)]),
    (
        "concat",
        lambda: nn.Concat(1),
        lambda t: lambda a, b: t.cat([a, b], dim=1),
        [(2, 3, 2), (2, 1, 2)],
    ),
    (
        "concat_negative_axis",
        lambda: nn.Concat(-1),
        lambda t: lambda a, b: t.cat([a, b], dim=-1),
        [(2, 3), (2, 2)],
    ),
]

CASE_PARAMS = [pytest.param(*case[1:], id=case[0]) for case in CASES]
# The padding row of an embedding gets no gradient by definition (PyTorch's neither), so
# finite differences disagree there on purpose; the PyTorch comparison covers that case.
GRADCHECK_PARAMS = [
    pytest.param(*case[1:], id=case[0]) for case in CASES if case[0] != "embedding_padding_idx"
]


def make_arrays(specs, seed: int = 0) -> list[np.ndarray]:
    """Float64 standard-normal arrays for shapes; integer arrays for index specs."""
    rng = np.random.default_rng(seed)
    arrays = []
    for spec in specs:
        if isinstance(spec, np.ndarray):
            arrays.append(spec)
        elif spec[0] == "indices":
            arrays.append(rng.integers(0, spec[2], size=spec[1]))
        else:
            arrays.append(rng.standard_normal(spec))
    return arrays


def as_inputs(arrays) -> list[Tensor]:
    return [
        Tensor(a, requires_grad=True, dtype=F64) if a.dtype.kind == "f" else Tensor(a)
        for a in arrays
    ]


@pytest.mark.parametrize("make_ours, make_theirs, specs", GRADCHECK_PARAMS)
def test_layer_gradients_match_finite_differences(make_ours, make_theirs, specs):
    with nn.init.seeded(0):
        layer = make_ours()
    inputs = as_inputs(make_arrays(specs))
    checked = [x for x in inputs if x.requires_grad] + list(layer.parameters())

    def run(*_):
        # gradcheck perturbs the checked tensors in place, so the layer sees every change.
        return layer(*inputs)

    assert gradcheck(run, checked)


@pytest.mark.parametrize("make_ours, make_theirs, specs", CASE_PARAMS)
def test_layer_matches_pytorch(torch, make_ours, make_theirs, specs):
    with nn.init.seeded(0):  # the same weights whatever ran before
        ours = make_ours()
    theirs = make_theirs(torch)
    if isinstance(theirs, torch.nn.Module):
        state = {name: torch.from_numpy(value) for name, value in ours.state_dict().items()}
        theirs.load_state_dict(state, strict=True)
        theirs.double().train(ours.training)
    arrays = make_arrays(specs)
    our_inputs = as_inputs(arrays)
    their_inputs = [torch.tensor(a, requires_grad=a.dtype.kind == "f") for a in arrays]

    our_output = ours(*our_inputs)
    their_output = theirs(*their_inputs)
    np.testing.assert_allclose(
        our_output.numpy(), their_output.detach().numpy(), rtol=1e-5, atol=1e-10
    )
    upstream = np.random.default_rng(1).standard_normal(our_output.shape)
    our_output.backward(upstream)
    their_output.backward(torch.from_numpy(upstream))

    for position, (mine, reference) in enumerate(zip(our_inputs, their_inputs, strict=True)):
        if mine.requires_grad:
            np.testing.assert_allclose(
                mine.grad.numpy(),
                reference.grad.numpy(),
                rtol=1e-5,
                atol=1e-10,
                err_msg=f"gradient of input {position}",
            )
    if isinstance(theirs, torch.nn.Module):
        their_parameters = dict(theirs.named_parameters())
        for name, parameter in ours.named_parameters():
            np.testing.assert_allclose(
                parameter.grad.numpy(),
                their_parameters[name].grad.numpy(),
                rtol=1e-5,
                atol=1e-10,
                err_msg=f"gradient of {name}",
            )
        their_buffers = dict(theirs.named_buffers())
        for name, buffer in ours.named_buffers():
            np.testing.assert_allclose(
                buffer.numpy(),
                their_buffers[name].numpy(),
                rtol=1e-5,
                atol=1e-12,
                err_msg=f"buffer {name} after the step",
            )


@pytest.mark.gpu
@pytest.mark.skipif(not backend.cuda_available(), reason="needs CuPy and a CUDA device")
@pytest.mark.parametrize("make_ours, make_theirs, specs", CASE_PARAMS)
def test_layer_on_cuda_matches_cpu(make_ours, make_theirs, specs):
    with nn.init.seeded(0):
        cpu_layer = make_ours()
    with nn.init.seeded(0):
        cuda_layer = make_ours().to("cuda")
    cpu_inputs = as_inputs(make_arrays(specs))
    cuda_inputs = [Tensor(x.data, requires_grad=x.requires_grad, device="cuda") for x in cpu_inputs]
    cpu_output, cuda_output = cpu_layer(*cpu_inputs), cuda_layer(*cuda_inputs)
    assert cuda_output.device.type == "cuda"
    np.testing.assert_allclose(cuda_output.numpy(), cpu_output.numpy(), rtol=1e-10, atol=1e-12)
    upstream = np.random.default_rng(1).standard_normal(cpu_output.shape)
    cpu_output.backward(upstream)
    cuda_output.backward(upstream)
    cpu_tensors = [x for x in cpu_inputs if x.requires_grad] + list(cpu_layer.parameters())
    cuda_tensors = [x for x in cuda_inputs if x.requires_grad] + list(cuda_layer.parameters())
    for cpu_tensor, cuda_tensor in zip(cpu_tensors, cuda_tensors, strict=True):
        np.testing.assert_allclose(
            cuda_tensor.grad.numpy(), cpu_tensor.grad.numpy(), rtol=1e-10, atol=1e-12
        )


@pytest.mark.parametrize("make_ours, make_theirs, specs", CASE_PARAMS)
def test_layer_on_a_device_reads_nothing_back_and_matches_cpu(make_ours, make_theirs, specs):
    """On the strict device (a GPU stand-in that refuses reads inside a step): the GPU
    route of every layer, its fused kernels' references included, queues forward and
    backward without waiting, and computes what the host computes."""
    from bigdl_py import device_waits

    with nn.init.seeded(0):
        cpu_layer = make_ours()
    with nn.init.seeded(0):
        device_layer = make_ours().to("strict")
    cpu_inputs = as_inputs(make_arrays(specs))
    device_inputs = [
        Tensor(x.data, requires_grad=x.requires_grad, device="strict") for x in cpu_inputs
    ]
    cpu_output = cpu_layer(*cpu_inputs)
    upstream = np.random.default_rng(1).standard_normal(cpu_output.shape)
    cpu_output.backward(upstream)
    with device_waits.no_device_waits():
        device_output = device_layer(*device_inputs)
        device_output.backward(Tensor(upstream, device="strict"))
    np.testing.assert_allclose(device_output.numpy(), cpu_output.numpy(), rtol=1e-9, atol=1e-12)
    cpu_tensors = [x for x in cpu_inputs if x.requires_grad] + list(cpu_layer.parameters())
    device_tensors = [x for x in device_inputs if x.requires_grad] + list(device_layer.parameters())
    for cpu_tensor, device_tensor in zip(cpu_tensors, device_tensors, strict=True):
        np.testing.assert_allclose(
            device_tensor.grad.numpy(), cpu_tensor.grad.numpy(), rtol=1e-9, atol=1e-12
        )


# --- Dropout in training mode ----------------------------------------------------------------
# The table above covers Dropout in evaluation and with p=0. In training its mask is random,
# so it cannot share the table: finite differences need the same mask on every call, and
# PyTorch draws its masks from its own generator.
def test_dropout_in_training_gradient_matches_finite_differences():
    x = Tensor(np.random.default_rng(0).standard_normal((4, 6)), requires_grad=True, dtype=F64)

    def run(a):
        # A fresh layer with a fixed seed draws the same mask on every call.
        return nn.Dropout(0.4, seed=5)(a)

    assert gradcheck(run, [x])


def test_dropout_in_training_scales_and_masks_like_pytorch(torch):
    """Output and input gradient follow PyTorch's rule given each library's own mask:
    kept elements scaled by 1/(1-p) forward and backward, dropped ones zero, about p dropped."""
    p = 0.3
    values = 1.0 + np.random.default_rng(0).random((200, 50))  # no zeros: a zero marks a drop
    upstream = np.random.default_rng(1).standard_normal(values.shape)

    ours = Tensor(values, requires_grad=True, dtype=F64)
    our_output = nn.Dropout(p, seed=0)(ours)
    our_output.backward(upstream)
    theirs = torch.tensor(values, requires_grad=True)
    torch.manual_seed(0)
    their_output = torch.nn.Dropout(p).train()(theirs)
    their_output.backward(torch.from_numpy(upstream))

    results = [
        (our_output.numpy(), ours.grad.numpy()),
        (their_output.detach().numpy(), theirs.grad.numpy()),
    ]
    for output, gradient in results:
        kept = output != 0
        np.testing.assert_allclose(output, np.where(kept, values / (1 - p), 0.0), rtol=1e-12)
        np.testing.assert_allclose(gradient, np.where(kept, upstream / (1 - p), 0.0), rtol=1e-12)
        assert abs((~kept).mean() - p) < 0.02
