"""DenseNet factory: shapes, small-input resizing, layer groups, config round-trip."""

from __future__ import annotations

import json

import pytest
import torch

from fed_auc.models import (
    ARCHITECTURES,
    DenseNetClassifier,
    LayerGroup,
    build_model,
    group_of,
    layer_groups,
    model_from_config,
)


@pytest.fixture(scope="module")
def big_models() -> dict[str, DenseNetClassifier]:
    """One instance per full-size arch, built once (about a second each)."""
    return {arch: build_model(arch, 2) for arch in ARCHITECTURES if arch != "tiny"}


def _all_models(big_models: dict[str, DenseNetClassifier]) -> dict[str, DenseNetClassifier]:
    return {**big_models, "tiny": build_model("tiny", 2)}


@pytest.mark.parametrize("side", [16, 28, 32, 64])
@pytest.mark.parametrize("labels", [1, 3])
def test_tiny_output_shape(side: int, labels: int) -> None:
    model = build_model("tiny", labels).eval()
    with torch.no_grad():
        out = model(torch.rand(4, 1, side, side))
    assert out.shape == (4, labels)
    assert torch.isfinite(out).all()


def test_small_inputs_are_resized_bilinearly_to_32() -> None:
    torch.manual_seed(0)
    model = build_model("tiny").eval()
    x = torch.rand(2, 1, 28, 20)
    resized = torch.nn.functional.interpolate(
        x, size=(32, 32), mode="bilinear", align_corners=False
    )
    with torch.no_grad():
        torch.testing.assert_close(model(x), model(resized))
        # A side that is already large enough is left alone.
        wide = torch.rand(2, 1, 28, 40)
        wide_resized = torch.nn.functional.interpolate(
            wide, size=(32, 40), mode="bilinear", align_corners=False
        )
        torch.testing.assert_close(model(wide), model(wide_resized))


def test_output_is_raw_logits_and_trains() -> None:
    """No final activation: logits leave (0, 1), and gradients reach the stem."""
    torch.manual_seed(1)
    model = build_model("tiny")
    with torch.no_grad():
        model.net.class_layers.out.bias.fill_(5.0)
    out = model(torch.rand(4, 1, 28, 28))
    assert (out > 1).all()
    out.sum().backward()
    assert model.net.features.conv0.weight.grad.abs().sum() > 0


def test_densenet121_forward_at_32px(big_models: dict[str, DenseNetClassifier]) -> None:
    model = big_models["densenet121"].eval()
    with torch.no_grad():
        assert model(torch.rand(1, 1, 32, 32)).shape == (1, 2)


def test_bad_input_shape_raises() -> None:
    with pytest.raises(ValueError, match=r"\(B, 1, H, W\)"):
        build_model("tiny")(torch.rand(2, 3, 32, 32))
    with pytest.raises(ValueError, match=r"\(B, 1, H, W\)"):
        build_model("tiny")(torch.rand(2, 32, 32))


def test_parameter_names_keep_monai_layout() -> None:
    names = dict(build_model("tiny").named_parameters())
    assert "net.features.conv0.weight" in names
    assert "net.class_layers.out.weight" in names


def test_layer_groups_partition_params_and_buffers_in_order(
    big_models: dict[str, DenseNetClassifier],
) -> None:
    for arch, model in _all_models(big_models).items():
        blocks = len(ARCHITECTURES[arch][2])
        groups = layer_groups(model)
        expected = ["stem"]
        for k in range(1, blocks + 1):
            expected += [f"denseblock{k}"] + ([f"transition{k}"] if k < blocks else [])
        expected += ["norm", "classifier"]
        assert [g.name for g in groups] == expected, arch
        assert all(isinstance(g, LayerGroup) and g.param_names for g in groups)

        params = [n for n, _ in model.named_parameters()]
        buffers = [n for n, _ in model.named_buffers()]
        assert [n for g in groups for n in g.param_names] == params, arch
        assert [n for g in groups for n in g.buffer_names] == buffers, arch
        grouped = [n for g in groups for n in g.names]
        assert len(grouped) == len(set(grouped)) == len(params) + len(buffers)
        assert set(grouped) == set(model.state_dict())
        for g in groups:
            assert all(group_of(n) == g.name for n in g.names)


def test_layer_groups_follow_forward_order() -> None:
    """Group order equals the order in which a forward pass first touches each group."""
    model = build_model("tiny")
    touched: list[str] = []

    def hook_for(group: str):
        def hook(*_args) -> None:
            if group not in touched:
                touched.append(group)

        return hook

    for name, module in model.named_modules():
        if list(module.parameters(recurse=False)):
            module.register_forward_hook(hook_for(group_of(f"{name}.weight")))
    model(torch.rand(2, 1, 32, 32))
    assert touched == [g.name for g in layer_groups(model)]


def test_group_of() -> None:
    assert group_of("net.features.conv0.weight") == "stem"
    assert group_of("net.features.norm0.running_mean") == "stem"
    assert group_of("net.features.denseblock3.denselayer2.layers.conv1.weight") == "denseblock3"
    assert group_of("net.features.transition1.conv.weight") == "transition1"
    assert group_of("net.features.norm5.num_batches_tracked") == "norm"
    assert group_of("net.class_layers.out.bias") == "classifier"
    with pytest.raises(ValueError, match="features.bogus"):
        group_of("net.features.bogus.weight")
    with pytest.raises(ValueError):
        group_of("a")


def test_layer_group_is_frozen() -> None:
    group = layer_groups(build_model("tiny"))[0]
    with pytest.raises(AttributeError):
        group.name = "other"  # type: ignore[misc]


def test_config_round_trip(big_models: dict[str, DenseNetClassifier]) -> None:
    for arch, model in _all_models(big_models).items():
        cfg = json.loads(json.dumps(model.config()))
        assert cfg == {"arch": arch, "num_labels": 2, "in_channels": 1}
        rebuilt = model_from_config(cfg)
        assert isinstance(rebuilt, DenseNetClassifier)
        assert (rebuilt.arch, rebuilt.num_labels) == (arch, 2)
        original, copy = model.state_dict(), rebuilt.state_dict()
        assert list(original) == list(copy)
        assert all(original[k].shape == copy[k].shape for k in original)
    tiny = build_model("tiny", 3)
    model_from_config(tiny.config()).load_state_dict(tiny.state_dict())


def test_bad_arch_and_config_raise() -> None:
    with pytest.raises(ValueError, match="densenet121, densenet169, densenet201, tiny"):
        build_model("resnet50")
    with pytest.raises(ValueError, match="missing"):
        model_from_config({"num_labels": 1})
    with pytest.raises(ValueError, match="unknown"):
        model_from_config({"arch": "tiny", "num_labels": 1, "dropout": 0.2})
    with pytest.raises(ValueError, match="num_labels"):
        build_model("tiny", 0)
