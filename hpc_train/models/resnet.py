"""ResNet family written here, with torchvision's module names so state dicts interchange.

torchvision does not import beside the CPU torch build we use (see docs/environment.md), so
we define the networks ourselves. Everything that shows up in a state dict -- module names,
parameter shapes, buffer names -- matches `torchvision.models.resnet` exactly, which lets a
user load torchvision (or timm "tv_") weights into our models and vice versa. The stride of
a Bottleneck's downsampling sits on the 3x3 conv (ResNet v1.5), as in torchvision.
"""

from __future__ import annotations

from typing import Sequence, Type, Union

import torch
from torch import Tensor, nn

from hpc_train.models.catalog import ResNetOptions, TinyResNetOptions

__all__ = [
    "BasicBlock", "Bottleneck", "ResNet",
    "resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "resnet_tiny",
]


def conv3x3(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)


def conv1x1(in_planes: int, out_planes: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(in_planes, out_planes, kernel_size=1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1,
                 downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: Tensor) -> Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes: int, planes: int, stride: int = 1,
                 downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = conv1x1(inplanes, planes)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = conv3x3(planes, planes, stride)  # v1.5: stride on the 3x3, not the 1x1
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = conv1x1(planes, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: Tensor) -> Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


Block = Type[Union[BasicBlock, Bottleneck]]


class ResNet(nn.Module):
    """torchvision-compatible ResNet.

    `width` and `cifar_stem` exist for `resnet_tiny`; with the defaults (64, False) the
    module tree is torchvision's. The CIFAR stem keeps the names `conv1`/`bn1`/`maxpool`
    (maxpool becomes Identity, which has no state) so the key set stays the same shape.
    """

    def __init__(self, block: Block, layers: Sequence[int], num_classes: int = 1000,
                 zero_init_residual: bool = False, width: int = 64,
                 cifar_stem: bool = False) -> None:
        super().__init__()
        if len(layers) != 4:
            raise ValueError(f"layers must have 4 entries (one per stage), got {list(layers)}")
        self.inplanes = width
        if cifar_stem:
            # 32x32 inputs: a 7x7/2 conv plus maxpool would leave 8x8 after the stem.
            self.conv1 = nn.Conv2d(3, width, kernel_size=3, stride=1, padding=1, bias=False)
        else:
            self.conv1 = nn.Conv2d(3, width, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = (nn.Identity() if cifar_stem
                        else nn.MaxPool2d(kernel_size=3, stride=2, padding=1))
        self.layer1 = self._make_layer(block, width, layers[0])
        self.layer2 = self._make_layer(block, width * 2, layers[1], stride=2)
        self.layer3 = self._make_layer(block, width * 4, layers[2], stride=2)
        self.layer4 = self._make_layer(block, width * 8, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(width * 8 * block.expansion, num_classes)

        # Same init as torchvision; nn.Linear keeps its default init there too.
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, (nn.BatchNorm2d, nn.GroupNorm)):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)
        if zero_init_residual:
            # Each residual branch starts as zero, so every block starts as the identity
            # (Goyal et al. 2017, sec. 5.1): helps large-batch training.
            for m in self.modules():
                if isinstance(m, Bottleneck):
                    nn.init.constant_(m.bn3.weight, 0)
                elif isinstance(m, BasicBlock):
                    nn.init.constant_(m.bn2.weight, 0)

    def _make_layer(self, block: Block, planes: int, blocks: int,
                    stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(
                conv1x1(self.inplanes, planes * block.expansion, stride),
                nn.BatchNorm2d(planes * block.expansion),
            )
        layers = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


def shard_units(model: ResNet) -> list[nn.Module]:
    """fsdp's units: the four stages (the stem and the classifier stay with the root)."""
    return [model.layer1, model.layer2, model.layer3, model.layer4]


def _torchvision(block: Block, layers: Sequence[int]):
    """The builder of one of torchvision's ResNets: `builder(num_classes, **options)`."""
    def build(num_classes: int = 1000, **options) -> ResNet:
        chosen = ResNetOptions(**options)   # names and defaults: models/catalog.py
        return ResNet(block, layers, num_classes, chosen.zero_init_residual)

    return build


resnet18 = _torchvision(BasicBlock, [2, 2, 2, 2])
resnet34 = _torchvision(BasicBlock, [3, 4, 6, 3])
resnet50 = _torchvision(Bottleneck, [3, 4, 6, 3])
resnet101 = _torchvision(Bottleneck, [3, 4, 23, 3])
resnet152 = _torchvision(Bottleneck, [3, 8, 36, 3])


def resnet_tiny(num_classes: int = 10, **options) -> ResNet:
    """A narrow BasicBlock ResNet with a CIFAR stem: 32x32 images train in seconds on a CPU.

    For tests and smoke runs, not accuracy. About 0.31 M parameters at width 16 (10 classes).
    `options` are `TinyResNetOptions` (models/catalog.py).
    """
    chosen = TinyResNetOptions(**options)
    return ResNet(BasicBlock, list(chosen.layers), num_classes, chosen.zero_init_residual,
                  width=chosen.width, cifar_stem=True)
