"""Every reply is checked before aggregation; each problem is named."""

from __future__ import annotations

import pytest
import torch

from fed_auc.coordinator.screening import InvalidReply, validate_reply
from fed_auc.exchange import Reply, ReplyLayout

MODEL = {
    "w/conv": torch.zeros(2, 3),
    "auc/a": torch.zeros(1),
    "auc/alpha": torch.zeros(1),
    "buf/bn.running_mean": torch.zeros(3),
}


LAYOUT = ReplyLayout(prefixes=("", "dc/"))


def _reply(**changes) -> Reply:
    tensors = {name: t.clone() for name, t in MODEL.items()}
    tensors.update(
        {"dc/" + n: torch.zeros_like(t) for n, t in MODEL.items() if not n.startswith("buf/")}
    )
    tensors.update(changes.pop("tensors", {}))
    for name in changes.pop("drop", []):
        del tensors[name]
    return Reply(tensors, steps=4, num_examples=10, site="st-a", **changes)


def test_a_well_formed_reply_passes():
    validate_reply(_reply(), MODEL, LAYOUT)


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        (_reply(tensors={"w/conv": torch.full((2, 3), float("nan"))}), "'w/conv' contains NaN"),
        (_reply(tensors={"auc/a": torch.tensor([float("inf")])}), "'auc/a' contains NaN or inf"),
        (_reply(tensors={"w/conv": torch.zeros(3, 2)}), r"shape \(3, 2\), expected \(2, 3\)"),
        (_reply(tensors={"w/conv": torch.zeros(2, 3, dtype=torch.float64)}), "dtype"),
        (_reply(tensors={"w/other": torch.zeros(1)}), "unexpected tensor 'w/other'"),
        (_reply(tensors={"dc/w/conv": torch.zeros(5)}), "'dc/w/conv' has shape"),
        (_reply(drop=["buf/bn.running_mean"]), "missing.*buf/bn.running_mean"),
        (_reply(drop=["auc/alpha"]), r"missing tensor\(s\) \['auc/alpha'\]"),
        (_reply(drop=["dc/auc/a"]), r"missing tensor\(s\) \['dc/auc/a'\]"),
        (_reply(tensors={"mean/w/conv": torch.zeros(2, 3)}), "unexpected tensor 'mean/w/conv'"),
        (_reply(tensors={"w/conv": [[0.0] * 3] * 2}), "is a list, not a tensor"),
        (_reply(metrics={"train_loss": float("nan")}), "metric 'train_loss'"),
    ],
)
def test_bad_replies_are_rejected_with_the_tensor_named(reply, message):
    with pytest.raises(InvalidReply, match=message) as info:
        validate_reply(reply, MODEL, LAYOUT)
    assert "site 'st-a'" in str(info.value)


def test_bad_counts_are_rejected():
    reply = _reply()
    reply.num_examples = 0
    with pytest.raises(InvalidReply, match="num_examples"):
        validate_reply(reply, MODEL, LAYOUT)
