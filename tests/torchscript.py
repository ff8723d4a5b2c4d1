"""`script(module)`: `torch.jit.script` made safe against a stale entry in torch's builtin table.

TorchScript resolves a module attribute to a builtin op by looking its `id()` up in
`torch.jit._builtins._builtin_table`. Torch leaves dead ids there: when `torch.library` adds an overload to an
existing op (importing `torch.export` does, for `quantized_decomposed::*`), the op object is replaced and the old
one freed, but its id stays registered. A fresh attribute that CPython happens to allocate at that address (a
Conv2d's `_reversed_padding_repeated_twice` list, say) is then taken for a builtin and scripting fails with
"builtin cannot be used as a value" - by chance, depending on the allocator (CI failed on it, a local run did
not). A live builtin is callable and not a module, so an entry whose id belongs to a non-callable attribute or to a
submodule is certainly stale; `script` drops exactly those entries before scripting.

Import it in a test module with `from torchscript import script` (pytest puts `tests/` on the path).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.jit._builtins import _get_builtin_table


def stale_builtin_ids(module: nn.Module) -> set[int]:
    """Ids in torch's builtin table that belong to an attribute of `module` (or of a submodule) that cannot be a
    builtin: a value that is not callable, or a module."""
    table = _get_builtin_table()
    return {id(v) for m in module.modules() for v in [m, *vars(m).values()]
            if id(v) in table and (not callable(v) or isinstance(v, nn.Module))}


def script(module: nn.Module) -> torch.jit.ScriptModule:
    """`torch.jit.script(module)` after dropping the builtin-table entries that are stale for this module."""
    table = _get_builtin_table()
    for i in stale_builtin_ids(module):
        del table[i]
    return torch.jit.script(module)
