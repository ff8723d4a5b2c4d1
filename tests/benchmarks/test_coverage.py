"""Coverage of the rules' interval methods at the quick preset's sizes: a small run of `benchmarks.coverage`, with
a band that the old methods (the min-max of per-seed values, the percentile bootstrap over 3 seeds) fail."""

from __future__ import annotations

import json

import numpy as np

from benchmarks.coverage import Coverage, flip_methods, main, slope_methods, tost_size

#: 400 replications: Monte Carlo error about 0.011 at 0.95, so a method covering 0.95 falls outside
#: [0.91, 0.99] with probability about 1e-4; the old methods cover 0.74 (3 seeds) and 0.998-1 (10 seeds).
REPS, BAND = 400, (0.91, 0.99)


def _inside(c: Coverage) -> bool:
    return BAND[0] <= c.coverage <= BAND[1]


def test_seed_level_methods_cover_and_the_old_ones_do_not():
    rng = np.random.default_rng(20_260_313)
    flips = flip_methods(REPS, 10, 50, 0.15, rng)
    used = [c for c in flips if not c.reference]
    assert len(used) == 5 and all(_inside(c) for c in used), [(c.method, c.coverage) for c in used]
    minmax = next(c for c in flips if c.method.startswith("min-max"))
    assert not _inside(minmax) and minmax.coverage > BAND[1]
    slopes = slope_methods(REPS, 10, 0.2, rng)
    assert _inside(next(c for c in slopes if not c.reference))
    old3 = next(c for c in slope_methods(REPS, 3, 0.05, rng) if c.reference)
    assert not _inside(old3) and old3.coverage < BAND[0]


def test_tost_size_at_the_margin_is_at_most_its_level():
    rng = np.random.default_rng(7)
    c = tost_size(REPS, 10, 50, 0.05, rng)
    assert c.coverage >= BAND[0]


def test_cli_writes_json_and_rejects_bad_sizes(tmp_path, capsys):
    assert main(["--reps", "0"]) == 2
    assert "--reps" in capsys.readouterr().err
    out = tmp_path / "cov.json"
    main(["--reps", "20", "--json", str(out)])  # too few replications to judge: only the record is checked
    rec = json.loads(out.read_text())
    assert rec["reps"] == 20 and rec["seeds"] == 10 and rec["target"] == 0.95
    methods = {r["method"] for r in rec["rows"]}
    assert {"t (flip rate)", "fieller (ratio of flip rates)", "t (per-seed slopes)"} <= methods
    assert all(0 <= r["coverage"] <= 1 and r["mc_error"] >= 0 for r in rec["rows"])
