"""`tests/torchscript.py` against the failure it guards: a stale id in torch's builtin table that a fresh attribute
happens to occupy. The collision CI met by chance is planted here, so plain `torch.jit.script` must fail on it and
`script` must not, while a real builtin attribute still resolves."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.jit._builtins import _get_builtin_table
from torchscript import script, stale_builtin_ids


class Act(nn.Module):
    """Holds a real builtin (`torch.relu`) as an attribute: its table entry is live and must survive."""

    def __init__(self) -> None:
        super().__init__()
        self.c = nn.Conv2d(1, 2, 3)
        self.f = torch.relu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.f(self.c(x))


def plant(conv: nn.Conv2d) -> int:
    """Register the id of `conv`'s padding list as if a freed op had lived there."""
    i = id(conv._reversed_padding_repeated_twice)
    _get_builtin_table()[i] = "aten::add"
    return i


def test_a_planted_stale_id_breaks_plain_scripting():
    conv = nn.Conv2d(1, 4, 5, stride=3)
    i = plant(conv)
    try:
        with pytest.raises(RuntimeError, match="builtin cannot be used as a value"):
            torch.jit.script(conv)
    finally:
        _get_builtin_table().pop(i, None)


def test_script_drops_only_the_stale_entries():
    m = Act()
    i = plant(m.c)
    assert stale_builtin_ids(m) == {i}
    scripted = script(m)
    assert i not in _get_builtin_table()
    assert _get_builtin_table()[id(torch.relu)] == "aten::relu"
    x = torch.randn(2, 1, 6, 6)
    assert torch.equal(scripted(x), m(x))
