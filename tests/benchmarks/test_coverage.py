"""Coverage of the rules' interval methods at the quick preset's sizes: a small run of `benchmarks.coverage`, with
a band that the old methods (the min-max of per-seed values, the percentile bootstrap over 3 seeds) fail."""

from __future__ import annotations

import json
import math

import numpy as np

from benchmarks import coverage
from benchmarks.coverage import Coverage, flip_methods, main, slope_methods, tost_methods
from empirics.intervals import fieller, t_interval, tost_ratio

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


def _by_kind(rows: list[Coverage]) -> dict[str, list[Coverage]]:
    out: dict[str, list[Coverage]] = {}
    for c in rows:
        out.setdefault(c.kind, []).append(c)
    return out


def test_tost_one_sided_sizes_and_its_90_percent_interval_are_nominal():
    """Each one-sided test's 1 - size is 0.95 and the 90 % interval covers 0.90, also where the seeds vary so much
    that the TOST as a whole almost never declares equivalence at the margin (its inherent conservatism)."""
    rows = _by_kind(tost_methods(REPS, 10, 50, 0.15, np.random.default_rng(7)))
    assert len(rows["size"]) == 2 and all(_inside(c) for c in rows["size"]), [c.coverage for c in rows["size"]]
    (ci,) = rows["interval"]
    assert ci.nominal == 0.90 and abs(ci.coverage - 0.90) <= 3 * math.sqrt(0.09 / ci.reps), ci.coverage
    (level,) = rows["level"]
    assert level.check() == "pass" and level.coverage > BAND[1]  # far fewer than alpha rejections: conservative
    (power,) = rows["power"]
    assert power.check() == "info" and power.band() is None


def test_a_wrong_method_fails_the_check(monkeypatch):
    """The check catches a deliberately wrong method: a too-narrow interval (80 % sold as 95 %), and a TOST whose
    one-sided tests run at 0.15 instead of 0.05."""
    rng = np.random.default_rng(11)
    monkeypatch.setattr(coverage, "t_interval", lambda v: t_interval(v, level=0.80))
    monkeypatch.setattr(coverage, "fieller", lambda a, b: fieller(a, b, level=0.80))
    narrow = [c for c in flip_methods(REPS, 10, 50, 0.05, rng, references=False)]
    assert narrow and all(c.check() == "fail" and not _inside(c) for c in narrow), [c.coverage for c in narrow]
    monkeypatch.setattr(coverage, "tost_ratio", lambda a, b, lo, hi: tost_ratio(a, b, lo, hi, alpha=0.15))
    rows = _by_kind(tost_methods(REPS, 10, 50, 0.0, rng))
    wrong = rows["size"] + rows["interval"] + rows["level"]
    assert all(c.check() == "fail" for c in wrong), [c.coverage for c in wrong]


def test_check_bands_by_kind():
    assert Coverage("m", "s", 10, 2000, 1900).check() == "pass"
    assert Coverage("m", "s", 10, 2000, 1990).check() == "fail"  # too wide is wrong too
    assert Coverage("m", "s", 10, 2000, 1999, "level").check() == "pass"  # a test may be conservative
    assert Coverage("m", "s", 10, 2000, 1800, "level").check() == "fail"
    assert Coverage("m", "s", 10, 2000, 5, "reference").check() == "info"


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
    assert {r["check"] for r in rec["rows"]} <= {"pass", "fail", "info"} and rec["min_reps_for_check"] == 2000
    assert {r["kind"] for r in rec["rows"]} == {"interval", "size", "level", "power", "reference"}
