"""The readers of a stored `per_width` table (`ntkm.tables`): widths are string keys, read back as numbers."""

from __future__ import annotations

import pytest

from ntkm.tables import at_width, widths

TABLE = {"256": {"function_abs": {"mean": 2.0, "std": 0.1}}, "16": {"function_abs": {"mean": 5.0, "std": 0.4}},
         "64": {"function_abs": {"mean": 3.0, "std": 0.2}}}


def test_widths_are_numbers_in_ascending_order():
    assert widths(TABLE) == [16, 64, 256]  # as strings, "256" < "64"


def test_at_width_reads_one_metric_at_one_width():
    assert at_width(TABLE, 64, "function_abs") == {"mean": 3.0, "std": 0.2}
    assert [at_width(TABLE, w, "function_abs")["mean"] for w in widths(TABLE)] == [5.0, 3.0, 2.0]
    with pytest.raises(KeyError):
        at_width(TABLE, 32, "function_abs")
    with pytest.raises(KeyError):
        at_width(TABLE, 64, "kernel_drift")
