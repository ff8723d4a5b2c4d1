"""`python -m benchmarks.costs`: on times the cost model itself generated, the fit and its report are exact."""

from __future__ import annotations

from benchmarks.costs import report
from verify import costs
from verify.experiments import units_for


def test_report_on_times_the_model_generated_is_exact():
    units = [(n, u.config) for n, u in units_for("smoke").items() if n.startswith(("ntk-distance", "malleability"))]
    truth = costs.Analytic({**costs.CALIBRATED.c, "kernel": 3 * costs.CALIBRATED.c["kernel"]})
    times = [c.total_s for c in costs.plan(units, truth).values()]
    record = {"units": {n: {"config": cfg, "wall_s": t, "cached": False} for (n, cfg), t in zip(units, times,
                                                                                                  strict=True)}}
    rec = report(record)
    a = rec["agreement"]["fitted"]
    assert abs(a["median_ratio"] - 1) < 1e-6 and abs(a["total_ratio"] - 1) < 1e-6 and a["units"] == len(units)
    assert a["spearman"] > 1 - 1e-9
    # leave-one-out: a unit whose feature no other unit has cannot be predicted, but most are, exactly
    assert abs(rec["agreement"]["leave_one_out"]["median_ratio"] - 1) < 1e-6
    assert [u["unit"] for u in rec["units"]] == [n for n, _ in units]


def test_a_record_of_cached_units_gets_a_one_line_error(tmp_path, capsys):
    """A --resume re-render (every unit cached, no time measured) cannot calibrate anything: exit 2, one line."""
    from benchmarks.costs import main
    from ntkm.codec import write_json

    path = tmp_path / "claims.json"
    write_json(path, {"units": {"theory": {"cached": True, "wall_s": 0.5, "config": {"seed": 0}}}})
    assert main([str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no unit computed" in err
