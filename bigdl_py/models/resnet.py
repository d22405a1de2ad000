"""Residual networks for 32x32 images (He et al. 2015), with torchvision's parameter names.

CIFAR form: a 3x3 stride-1 stem, no max-pool, stages of :class:`BasicBlock` (the first block
of each later stage halves the resolution), a global average pool and one ``Linear``.
Parameter and buffer names are torchvision's ``ResNet`` names (``conv1``, ``bn1``,
``layer1.0.conv1``, ``layer2.0.downsample.0``, ``fc``), so a PyTorch model built the same way
exchanges weights with this one through :func:`bigdl_py.nn.load_safetensors`.

* :func:`resnet18`: torchvision's ResNet-18 stages (2, 2, 2, 2 blocks; 64 to 512 channels)
  with the CIFAR stem; about 11.2 M parameters.
* :func:`resnet20`: the paper's CIFAR ResNet-20 (3 stages of 3 blocks; 16, 32, 64 channels);
  about 0.27 M parameters. Its shortcuts change shape through a 1x1 convolution and batch
  norm (the paper's option B), as torchvision's do, rather than option A's zero padding.
"""

from __future__ import annotations

from collections.abc import Sequence

from bigdl_py import nn


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with batch norm, added to the (projected) input, then ReLU.

    Parameters
    ----------
    in_channels, out_channels : int
    stride : int
        Stride of the first convolution; with ``stride != 1`` or a change of channels the
        shortcut is ``downsample`` = 1x1 convolution + batch norm.
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        if stride != 1 or in_channels != out_channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )
        else:
            self.downsample = None

    def forward(self, x):
        shortcut = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + shortcut)


class ResNet(nn.Module):
    """A CIFAR-form residual network of :class:`BasicBlock` stages.

    Parameters
    ----------
    blocks_per_stage : sequence of int
        Blocks in ``layer1``, ``layer2``, ...; each stage after the first halves H and W.
    widths : sequence of int
        Channels of each stage (same length as ``blocks_per_stage``).
    num_classes : int
        Size of the output (logits; pair with ``nn.CrossEntropyLoss``).
    in_channels : int
        Image channels (3 for CIFAR).

    Raises
    ------
    ValueError
        If the stage lists differ in length, are empty, or hold a non-positive count.
    """

    def __init__(
        self,
        blocks_per_stage: Sequence[int],
        widths: Sequence[int],
        num_classes: int = 10,
        in_channels: int = 3,
    ):
        super().__init__()
        blocks_per_stage, widths = list(blocks_per_stage), list(widths)
        if not blocks_per_stage or len(blocks_per_stage) != len(widths):
            raise ValueError(
                f"ResNet: blocks_per_stage {blocks_per_stage} and widths {widths} must be "
                "non-empty and of the same length"
            )
        if min(blocks_per_stage) < 1 or min(widths) < 1:
            raise ValueError(
                f"ResNet: blocks_per_stage {blocks_per_stage} and widths {widths} must be positive"
            )
        self.conv1 = nn.Conv2d(in_channels, widths[0], 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.relu = nn.ReLU()
        channels = widths[0]
        for stage, (blocks, width) in enumerate(zip(blocks_per_stage, widths, strict=True)):
            stride = 1 if stage == 0 else 2
            layers = [BasicBlock(channels, width, stride)]
            layers += [BasicBlock(width, width) for _ in range(blocks - 1)]
            setattr(self, f"layer{stage + 1}", nn.Sequential(*layers))
            channels = width
        self.stage_count = len(widths)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(channels, num_classes)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        for stage in range(self.stage_count):
            x = getattr(self, f"layer{stage + 1}")(x)
        return self.fc(self.avgpool(x).flatten(1))


# Known to bigdl_py.nn.save/load by name (the safe format names classes, never pickles them).
nn.register_module(BasicBlock)
nn.register_module(ResNet)


def resnet18(num_classes: int = 10) -> ResNet:
    """ResNet-18 for 32x32 images: 4 stages of 2 blocks, 64/128/256/512 channels."""
    return ResNet([2, 2, 2, 2], [64, 128, 256, 512], num_classes)


def resnet20(num_classes: int = 10) -> ResNet:
    """ResNet-20 for CIFAR (He et al.): 3 stages of 3 blocks, 16/32/64 channels."""
    return ResNet([3, 3, 3], [16, 32, 64], num_classes)
