"""The lab's CNN: plain torch, nothing of hpc_train."""

from __future__ import annotations

from torch import nn


def _block(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                         nn.ReLU(inplace=True), nn.MaxPool2d(2))


class SmallCNN(nn.Module):
    """Three conv blocks, then global pooling and a linear classifier."""

    def __init__(self, num_classes: int = 10, width: int = 16):
        super().__init__()
        self.blocks = nn.ModuleList([_block(3, width), _block(width, 2 * width),
                                     _block(2 * width, 4 * width)])
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                  nn.Linear(4 * width, num_classes))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)

    def fsdp_units(self):
        """The submodules FSDP shards one by one (hpc_train reads this hint if it is there)."""
        return list(self.blocks)
