"""ResNet family: torchvision's parameter counts and key names, shapes, init options; the
registry and its torch-free catalog of names and options.

The big models are built on the meta device: counts and key names need no memory or init time.
"""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys

import pytest
import torch

from hpc_train.models import MODEL_NAMES, build_model
from hpc_train.models.catalog import MODELS, GptOptions
from hpc_train.models.resnet import BasicBlock, Bottleneck, ResNet, resnet_tiny

# torchvision.models.resnetXX(num_classes=1000): sum(p.numel() for p in m.parameters())
TORCHVISION_PARAMS = {
    "resnet18": 11_689_512,
    "resnet34": 21_797_672,
    "resnet50": 25_557_032,
    "resnet101": 44_549_160,
    "resnet152": 60_192_808,
}


def _meta(name: str, **options):
    with torch.device("meta"):
        return build_model(name, 1000, options)


@pytest.mark.parametrize("name", sorted(TORCHVISION_PARAMS))
def test_parameter_count_matches_torchvision(name):
    model = _meta(name)
    assert sum(p.numel() for p in model.parameters()) == TORCHVISION_PARAMS[name]


RESNET18_KEYS = [
    "conv1.weight", "bn1.weight", "bn1.bias", "bn1.running_mean", "bn1.running_var",
    "bn1.num_batches_tracked", "layer1.0.conv1.weight", "layer1.1.bn2.running_var",
    "layer2.0.downsample.0.weight", "layer2.0.downsample.1.weight",
    "layer2.0.downsample.1.running_mean", "layer4.1.conv2.weight", "fc.weight", "fc.bias",
]
RESNET50_KEYS = [
    "conv1.weight", "layer1.0.conv1.weight", "layer1.0.conv3.weight", "layer1.0.bn3.bias",
    "layer1.0.downsample.0.weight", "layer1.0.downsample.1.running_var",
    "layer2.0.downsample.0.weight", "layer3.5.bn2.weight", "layer4.2.bn3.running_var",
    "layer4.2.conv3.weight", "fc.weight", "fc.bias",
]


def test_resnet18_state_dict_keys():
    keys = set(_meta("resnet18").state_dict())
    assert set(RESNET18_KEYS) <= keys
    # BasicBlock has no third conv; layer1 keeps 64 channels so it has no downsample.
    assert not any(".conv3." in k or k.startswith("layer1.0.downsample") for k in keys)
    assert not any(k.startswith("layer1.2.") or k.startswith("layer4.2.") for k in keys)
    assert len(keys) == 122  # 62 parameters + 60 BN buffers, as torchvision


def test_resnet50_state_dict_keys_and_shapes():
    sd = _meta("resnet50").state_dict()
    assert set(RESNET50_KEYS) <= set(sd)
    assert "layer4.3.conv1.weight" not in sd
    assert len(sd) == 320  # 161 parameters + 159 BN buffers, as torchvision
    assert sd["conv1.weight"].shape == (64, 3, 7, 7)
    assert sd["layer1.0.downsample.0.weight"].shape == (256, 64, 1, 1)
    assert sd["layer4.2.conv3.weight"].shape == (2048, 512, 1, 1)
    assert sd["fc.weight"].shape == (1000, 2048)


def test_bottleneck_stride_on_3x3_v1_5():
    model = _meta("resnet50")
    block = model.layer2[0]
    assert block.conv1.stride == (1, 1)
    assert block.conv2.stride == (2, 2)
    assert block.downsample[0].stride == (2, 2)


def test_state_dict_round_trips_between_instances():
    a, b = resnet_tiny(10), resnet_tiny(10)
    b.load_state_dict(a.state_dict(), strict=True)
    assert all(torch.equal(a.state_dict()[k], v) for k, v in b.state_dict().items())


def test_resnet_tiny_forward_shape_and_trains_on_32x32():
    torch.manual_seed(0)
    model = build_model("resnet_tiny", 10)
    assert isinstance(model.maxpool, torch.nn.Identity)
    assert model.conv1.kernel_size == (3, 3) and model.conv1.stride == (1, 1)
    x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    out = model(x)
    assert out.shape == (8, 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    first = None
    for _ in range(8):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        first = loss.item() if first is None else first
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < first


def test_resnet18_forward_shape_on_64x64():
    model = build_model("resnet18", 7).eval()
    with torch.no_grad():
        assert model(torch.randn(2, 3, 64, 64)).shape == (2, 7)


def test_init_matches_torchvision():
    model = resnet_tiny(10, width=8)
    assert torch.all(model.bn1.weight == 1) and torch.all(model.bn1.bias == 0)
    # kaiming_normal_(fan_out, relu): std = sqrt(2 / (out_channels * k * k))
    w = model.layer4[0].conv2.weight  # 64 x 64 x 3 x 3 -> 36,864 samples
    expected = (2.0 / (64 * 9)) ** 0.5
    assert abs(w.std().item() / expected - 1) < 0.05


@pytest.mark.parametrize("block,last_bn", [(BasicBlock, "bn2"), (Bottleneck, "bn3")])
def test_zero_init_residual_zeroes_last_bn_of_each_block(block, last_bn):
    model = ResNet(block, [1, 2, 1, 1], num_classes=5, zero_init_residual=True, width=8)
    blocks = [m for m in model.modules() if isinstance(m, block)]
    assert len(blocks) == 5
    for b in blocks:
        assert torch.all(getattr(b, last_bn).weight == 0)
        assert torch.all(b.bn1.weight == 1)  # only the last BN of each block
    default = ResNet(block, [1, 1, 1, 1], num_classes=5, width=8)
    assert torch.all(getattr(default.layer1[0], last_bn).weight == 1)


def test_build_model_options_pass_through():
    model = build_model("resnet_tiny", 3, {"width": 4, "layers": [1, 2, 1, 1],
                                           "zero_init_residual": True})
    assert len(model.layer2) == 2 and model.fc.in_features == 32 and model.fc.out_features == 3
    assert torch.all(model.layer1[0].bn2.weight == 0)


def test_registry_names_and_errors():
    assert MODEL_NAMES == ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152",
                           "resnet_tiny", "gpt")
    with pytest.raises(ValueError, match="resnet18, resnet34.*resnet_tiny") as err:
        build_model("resnet51", 10)
    assert "Did you mean 'resnet50'" in str(err.value)
    with pytest.raises(ValueError, match="valid options"):
        build_model("resnet18", 10, {"width": 8})
    with pytest.raises(ValueError, match="num_classes"):
        build_model("resnet18", 0)


def test_the_catalog_is_read_without_torch():
    code = ("import sys, hpc_train.models, hpc_train.models.catalog; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_builders_take_their_options_from_the_catalog_only(name):
    module, function = MODELS[name].builder.split(":")
    builder = getattr(importlib.import_module(module), function)
    parameters = inspect.signature(builder).parameters
    # No option of its own, so no default written a second time: all go through **options.
    assert not set(parameters) & set(MODELS[name].option_names)
    assert any(p.kind is p.VAR_KEYWORD for p in parameters.values())
    with torch.device("meta"):
        build_model(name, 10, **({"seq_len": 8} if name == "gpt" else {}))


def test_gpt_depth_and_width_come_from_the_catalog():
    default = build_model("gpt", 256, seq_len=8)
    assert len(default) == GptOptions().layers + 2
    assert default[0].tokens.embedding_dim == GptOptions().dim
    assert len(build_model("gpt", 256, {"layers": 1, "dim": 8, "heads": 2}, seq_len=8)) == 3
