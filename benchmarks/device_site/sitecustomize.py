"""Run a process, and every process it starts, as on the device image: with `NTKM_DEVICE_BLOCK` set to a
comma-separated list of top-level modules (`benchmarks.device_image.blocked_modules`), each is absent, as on the
lent GPU machine: `None` in `sys.modules`, so importing it raises ModuleNotFoundError and
`importlib.util.find_spec` returns None (what optional-import probes, torch's among them, expect of a missing
module). Python imports this file at start-up only when this folder is on `PYTHONPATH`, which only the
device-image environment (`benchmarks.device_image.device_image_env`) puts there."""

from __future__ import annotations

import os
import sys

for _name in filter(None, os.environ.get("NTKM_DEVICE_BLOCK", "").split(",")):
    sys.modules.setdefault(_name, None)  # type: ignore[assignment]
