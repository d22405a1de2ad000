"""CIFAR ResNets: shapes, torchvision-style names, PyTorch parity through safetensors."""

from __future__ import annotations

import numpy as np
import pytest

from bigdl_py import nn
from bigdl_py.autograd import Tensor
from bigdl_py.models import resnet18, resnet20
from bigdl_py.models.resnet import ResNet


def torch_resnet(torch, blocks_per_stage, widths, num_classes):
    """The same network written in PyTorch, with torchvision's attribute names."""
    tnn = torch.nn

    class Block(tnn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = tnn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = tnn.BatchNorm2d(cout)
            self.relu = tnn.ReLU()
            self.conv2 = tnn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = tnn.BatchNorm2d(cout)
            self.downsample = None
            if stride != 1 or cin != cout:
                self.downsample = tnn.Sequential(
                    tnn.Conv2d(cin, cout, 1, stride, bias=False), tnn.BatchNorm2d(cout)
                )

        def forward(self, x):
            shortcut = x if self.downsample is None else self.downsample(x)
            out = self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))
            return self.relu(out + shortcut)

    class Net(tnn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = tnn.Conv2d(3, widths[0], 3, 1, 1, bias=False)
            self.bn1 = tnn.BatchNorm2d(widths[0])
            self.relu = tnn.ReLU()
            cin = widths[0]
            for stage, (blocks, width) in enumerate(zip(blocks_per_stage, widths, strict=True)):
                first = Block(cin, width, 1 if stage == 0 else 2)
                rest = [Block(width, width, 1) for _ in range(blocks - 1)]
                setattr(self, f"layer{stage + 1}", tnn.Sequential(first, *rest))
                cin = width
            self.stages = len(widths)
            self.fc = tnn.Linear(cin, num_classes)

        def forward(self, x):
            x = self.relu(self.bn1(self.conv1(x)))
            for stage in range(self.stages):
                x = getattr(self, f"layer{stage + 1}")(x)
            return self.fc(x.mean(dim=(2, 3)))

    return Net()


@pytest.fixture
def images(rng):
    return rng.normal(size=(2, 3, 32, 32)).astype(np.float32)


@pytest.mark.parametrize(
    "build, blocks, widths",
    [(resnet20, [3, 3, 3], [16, 32, 64]), (resnet18, [2, 2, 2, 2], [64, 128, 256, 512])],
)
def test_pytorch_weights_load_and_outputs_match(tmp_path, torch, images, build, blocks, widths):
    safetensors_torch = pytest.importorskip("safetensors.torch")
    torch.manual_seed(0)
    reference = torch_resnet(torch, blocks, widths, 7)
    with torch.no_grad():  # move BatchNorm's running statistics off their initial values
        reference(torch.from_numpy(images))
    reference.eval()
    path = tmp_path / "resnet.safetensors"
    safetensors_torch.save_file(reference.state_dict(), str(path))
    model = build(num_classes=7)
    assert list(model.state_dict()) == list(reference.state_dict())
    nn.load_safetensors(model, path)
    model.eval()
    with torch.no_grad():
        expected = reference(torch.from_numpy(images)).numpy()
    np.testing.assert_allclose(model(Tensor(images)).numpy(), expected, rtol=1e-4, atol=1e-4)


def test_shapes_and_sizes(images):
    model = resnet20(num_classes=10)
    assert model(Tensor(images)).shape == (2, 10)
    # He et al. give ResNet-20 0.27 M parameters (option A shortcuts, which have none);
    # the 1x1 projections of option B add about 3 k.
    assert 0.26e6 < model.num_parameters() < 0.28e6
    assert 11.1e6 < resnet18().num_parameters() < 11.3e6


def test_a_few_sgd_steps_lower_the_loss(rng, sgd_losses):
    images = rng.normal(size=(4, 3, 8, 8)).astype(np.float32)
    labels = rng.integers(0, 10, size=4)
    model = resnet20(num_classes=10)
    loss = nn.CrossEntropyLoss()
    losses = sgd_losses(model, lambda m: loss(m(Tensor(images)), labels), steps=2, lr=0.05)
    assert losses[-1] < losses[0]


def test_save_load_round_trip(tmp_path, rng):
    images = rng.normal(size=(2, 3, 8, 8)).astype(np.float32)
    model = resnet20(num_classes=4)
    model(Tensor(images))  # running statistics that differ from a fresh model's
    path = tmp_path / "resnet20.bigdl"
    nn.save(model.eval(), path)
    loaded = nn.load(path)
    assert isinstance(loaded, ResNet)
    np.testing.assert_array_equal(loaded(Tensor(images)).numpy(), model(Tensor(images)).numpy())


def test_bad_stage_lists_are_refused():
    with pytest.raises(ValueError, match="same length"):
        ResNet([2, 2], [16])
    with pytest.raises(ValueError, match="must be positive"):
        ResNet([2, 0], [16, 32])
