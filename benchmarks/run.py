"""Run the benchmark suite: one command, one Markdown table on stdout, one JSON record.

    python -m benchmarks                       # full run (under 15 minutes on a 2-core CPU)
    python -m benchmarks --quick               # tiny sizes, seconds (what the harness test uses)
    python -m benchmarks --json out.json --markdown benchmarks/RESULTS.md
    python -m benchmarks --with-quick          # also time `verify claims --preset quick` (~30 min)
    python -m benchmarks --only ntk,scaling    # sections: ntk influence attacks scaling peers precision stages
                                               #           presets audit
    python -m benchmarks --compare OLD.json    # then list rows slower / less accurate than OLD beyond their spread
    python -m benchmarks --compare OLD.json --against NEW.json   # compare two records, run nothing

Exit status 0 when every agreement check passed, 1 when any failed (the row says FAILED).
See benchmarks/README.md for what each row means.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import (
    ROOT,
    Check,
    Row,
    environment,
    exit_status,
    fmt_time,
    load_average,
    render_markdown,
    speedup,
)

SECTIONS = ("ntk", "influence", "attacks", "scaling", "peers", "precision", "stages", "presets", "audit")
DEFAULT_JSON = ROOT / "runs" / "benchmarks.json"


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def load_inputs(n_pool: int, n_test: int) -> tuple[np.ndarray, np.ndarray, str]:
    """MNIST rows: `n_pool` training images then `n_test` test images (float32 in [0, 1], labels).

    Uses the full MNIST files when found; otherwise the bundled sample, resampled with small noise up
    to the sizes asked for (the cost of every benchmark depends only on the shapes).
    """
    from empirics.data.datasets import DataRequest, load_dataset
    from ntkm.errors import UserInputError

    try:
        ds = load_dataset("mnist", n_train=n_pool, n_test=n_test,
                          request=DataRequest(sample="balanced", seed=0, source="full"))
        src = "MNIST (full IDX files), balanced subset, seed 0"
        xtr, ytr, xte, yte = ds.x_train, ds.y_train, ds.x_test, ds.y_test
    except UserInputError:
        ds = load_dataset("mnist", n_train=600, n_test=200, request=DataRequest(source="bundled"))
        rng = np.random.default_rng(0)
        itr, ite = rng.integers(0, 600, n_pool), rng.integers(0, 200, n_test)
        noise = rng.normal(0, 0.02, (n_pool + n_test, ds.x_train.shape[1])).astype(np.float32)
        xtr = np.clip(ds.x_train[itr] + noise[:n_pool], 0, 1)
        xte = np.clip(ds.x_test[ite] + noise[n_pool:], 0, 1)
        ytr, yte = ds.y_train[itr], ds.y_test[ite]
        src = "bundled MNIST sample (600 + 200 images) resampled with N(0, 0.02) noise: full files not found"
    x = np.concatenate([xtr, xte]).astype(np.float32)
    y = np.concatenate([ytr, yte]).astype(np.int64)
    return x, y, src


def _configs(quick: bool, cap_s: float) -> dict[str, Any]:
    from benchmarks.bench_attacks import AttackBenchConfig
    from benchmarks.bench_influence import InfluenceConfig
    from benchmarks.bench_ntk import NtkConfig
    from benchmarks.bench_peers import IFCase, PeersConfig
    from benchmarks.bench_precision import PrecisionConfig
    from benchmarks.bench_stages import StagesConfig

    if quick:
        return {
            "ntk": NtkConfig(ns=(8, 16), ms=(16, 32), probe_n=4, cap_s=min(cap_s, 5.0), repeats=2, headline=(16, 32),
                             gemm_size=256),
            "influence": InfluenceConfig(ns=(20, 40), n_test=10, m=64, cap_s=min(cap_s, 5.0), repeats=2),
            "attacks": AttackBenchConfig(n_train=40, n_test=10, width=64, steps=2, epochs=1, repeats=2,
                                         max_total_s=5.0),
            "peers": PeersConfig(nt_sizes=((32, 64),), nt_grid=(16, 64), if_m=32, if_epochs=1,
                                 if_cases=(IFCase("if20", 20, 3, cg_iters=(10, 30), cg_plain_iters=(30,), lissa=True,
                                                  arnoldi_iters=(30,)),),
                                 if_arnoldi_k=5, if_lissa_depth=60, atk_n=32, atk_m=64, cnn_n=40, cnn_n_test=8,
                                 cnn_epochs=1, cnn_batch=20, repeats=2, max_total_s=5.0),
            "precision": PrecisionConfig(cases=((32, 64, "relu"), (32, 64, "attn")), train_epochs=1, repeats=2),
            "stages": StagesConfig(presets=("smoke",), repeats=2, max_total_s=5.0),
        }
    return {"ntk": NtkConfig(cap_s=cap_s), "influence": InfluenceConfig(cap_s=cap_s),
            "attacks": AttackBenchConfig(), "peers": PeersConfig(), "precision": PrecisionConfig(),
            "stages": StagesConfig()}


LOAD_BY_SECTION: dict[str, list[float] | None] = {}


def _guard(section: str, fn: Callable[[], list[Row]]) -> list[Row]:
    """Run one section; an exception becomes a FAILED row (and a non-zero exit), the others still run.

    The load average before each section is kept (`environment.load_average_by_section`).
    """
    LOAD_BY_SECTION.setdefault(section, load_average())
    try:
        return fn()
    except Exception as exc:  # a broken section must not hide the others' results
        last = traceback.format_exception_only(type(exc), exc)[-1].strip()
        _log(traceback.format_exc())
        return [Row(section, f"{section} benchmarks", "-", checks=[Check("section completed", 0.0, 1.0, ">=")],
                    note=f"error: {last[:300]}")]


def headline(data: dict[str, Any], cfgs: dict[str, Any]) -> list[str]:
    """The key ratios, as sentences, from the numbers of this run."""
    out: list[str] = []
    ntk = data.get("ntk")
    if ntk and ntk.get("headline", {}).get("closed_s"):
        h = ntk["headline"]
        labels = {"generic": "generic path (jacrev + vmap, torch_func)", "vjp": "vjp/jvp NTK-vector products",
                  "loop": "autograd.grad loop"}
        for path, label in labels.items():
            g = h.get(path)
            if not g or not g.get("ratio") or g.get("status") == "FAILED":
                continue
            how = "measured" if g["measured"] else f"extrapolated with t ~ n^2 from measured n={g.get('base_n')}"
            target = ""
            if path == "generic":
                target = ("; lead's target >= 50x: " + ("met" if g["ratio"] >= 50 else "NOT met")
                          + f" (flop counts alone differ {h['flop_ratio']:,.0f}x: 2 c m d n^2 against the closed form)")
            out.append(f"NTK at n={h['n']}, m={h['m']}: closed form {fmt_time(h['closed_s'])} vs {label} "
                       f"{fmt_time(g['seconds'])} ({how}): **{g['ratio']:,.0f}x faster**{target}")
        big = max(ntk["closed"].items(), key=lambda kv: kv[1]["gflops"] if kv[0].endswith("float32") else 0)
        key, v = big
        _, n, m, _ = key.split("/")
        out.append(f"Closed-form NTK at n={n}, m={m}: {v['gflops']:.1f} GFLOP/s = {100 * v['fraction_of_gemm']:.0f}% "
                   f"of this machine's float32 GEMM rate ({ntk['gemm_gflops']['float32']:.1f} GFLOP/s)")
    inf = data.get("influence")
    if inf and inf.get("closed"):
        n = max(inf["closed"])
        b, cg = inf["brute"][n], inf["cg"][n]
        t = inf["closed"][n]
        sb = speedup(b["median_s"], t, "closed form", "brute")
        out.append(f"Influence at n={n}: closed-form LOO {fmt_time(t)} vs brute-force refits {fmt_time(b['median_s'])}"
                   f"{'' if b['measured'] else ' (extrapolated)'}: **{sb}**"
                   f"; vs CG first order {fmt_time(cg['median_s'])} ({cg['iters']} iterations): "
                   f"**{speedup(cg['median_s'], t, 'closed form', 'CG')}**")
    atk = data.get("attacks")
    if atk and atk.get("throughput"):
        tp = atk["throughput"]
        out.append("Attack throughput (examples/s, quick-preset width and steps): "
                   + ", ".join(f"{k} {v:,.0f}" for k, v in tp.items()))
        if "flip_eval_s" in atk:
            out.append(f"One flip-rate evaluation at the quick preset: {fmt_time(atk['flip_eval_s'])} "
                       f"(measure_model with its random baseline: {fmt_time(atk['measure_model_s'])})")
    for line in data.get("peers", {}).get("rows", []):
        out.append(line)
    prec = data.get("precision")
    if prec:
        worst = max(prec.items(), key=lambda kv: kv[1]["float32_err"])
        out.append(f"float32 closed-form NTK: largest error {worst[1]['float32_err']:.2g} at {worst[0]} "
                   f"({worst[1]['mask_flips']} flipped ReLU mask entries); float64 costs "
                   f"{min(v['t64_s'] / v['t32_s'] for v in prec.values()):.1f}-"
                   f"{max(v['t64_s'] / v['t32_s'] for v in prec.values()):.1f}x the float32 time")
    for k in ("presets_smoke", "presets_quick", "audit"):
        if k in data:
            out.append(data[k])
    return out


def main(argv: list[str] | None = None) -> int:
    """Parse the options, run the sections, print the table, write the record; the exit status."""
    p = argparse.ArgumentParser(description="Benchmarks of the suite's fast paths (see benchmarks/README.md).")
    p.add_argument("--quick", action="store_true", help="tiny sizes (seconds); presets and audit are skipped")
    p.add_argument("--json", default=str(DEFAULT_JSON), metavar="FILE",
                   help="write the full record here (default: %(default)s)")
    p.add_argument("--markdown", default=None, metavar="FILE", help="also write the Markdown table to FILE")
    p.add_argument("--only", default=None, help=f"comma-separated sections: {','.join(SECTIONS)}")
    p.add_argument("--skip", default="", help="comma-separated sections to leave out")
    p.add_argument("--with-quick", action="store_true", help="also time `verify claims --preset quick` (~30 min)")
    p.add_argument("--cap-s", type=float, default=30.0,
                   help="slow paths predicted to take longer than this are extrapolated (default: %(default)s)")
    p.add_argument("--in-process", action="store_true",
                   help="run NTK cases in this process (faster start; memory estimated from tensor sizes)")
    p.add_argument("--peers-python", default=None, help="interpreter of the peers venv (default: .venv-peers)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own choice)")
    p.add_argument("--compare", default=None, metavar="OLD.json",
                   help="after the run, list rows slower or less accurate than in OLD.json beyond their spread")
    p.add_argument("--against", default=None, metavar="NEW.json",
                   help="with --compare: compare OLD.json with this record instead of running")
    a = p.parse_args(argv)
    if a.against and not a.compare:
        p.error("--against needs --compare OLD.json")
    if a.compare and a.against:
        from benchmarks.compare import compare_files

        text, code = compare_files(a.compare, a.against)
        print(text)
        return code

    import torch

    if a.threads:
        torch.set_num_threads(a.threads)
    wanted = [s for s in (a.only.split(",") if a.only else SECTIONS) if s and s not in a.skip.split(",")]
    bad = [s for s in wanted if s not in SECTIONS]
    if bad:
        p.error(f"unknown section(s) {', '.join(bad)}; choose from {', '.join(SECTIONS)}")
    if a.quick and not a.only:
        wanted = [s for s in wanted if s not in ("presets", "audit")]
    t_start = time.perf_counter()
    env = environment()
    _log(f"benchmarks: sections {', '.join(wanted)}; load average {env['load_average_start']}")
    cfgs = _configs(a.quick, a.cap_s)
    devices = ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",)
    threads = torch.get_num_threads()
    rows: list[Row] = []
    data: dict[str, Any] = {}
    ntk_cfg, inf_cfg = cfgs["ntk"], cfgs["influence"]
    n_pool = max(max(ntk_cfg.ns), max(inf_cfg.ns), cfgs["peers"].n_pool,
                 max(c[0] for c in cfgs["precision"].cases))
    if "stages" in wanted:
        from verify.presets import preset

        n_pool = max([n_pool] + [preset(s)["mall_n_train"] for s in cfgs["stages"].presets]
                     + [preset(s)["n_train"] for s in cfgs["stages"].presets])
        n_test_pool = max([inf_cfg.n_test] + [preset(s)["mall_n_test"] for s in cfgs["stages"].presets])
    else:
        n_test_pool = inf_cfg.n_test
    x, y, source = load_inputs(n_pool, n_test_pool)
    env["inputs"] = source
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        inputs = Path(tmp) / "inputs.npz"
        np.savez(inputs, x=x[:n_pool])
        ntk_cfg.inputs, ntk_cfg.in_process, ntk_cfg.devices, ntk_cfg.threads = str(inputs), a.in_process, devices, \
            a.threads
        if "ntk" in wanted:
            from benchmarks.bench_ntk import SECTION, bench_ntk

            _log("section 1: empirical NTK")

            def run_ntk() -> list[Row]:
                r, data["ntk"] = bench_ntk(ntk_cfg, _log)
                return r

            rows += _guard(SECTION, run_ntk)
        if "influence" in wanted:
            from benchmarks.bench_influence import SECTION as ISEC
            from benchmarks.bench_influence import bench_influence

            _log("section 2: influence")
            xi = np.concatenate([x[:max(inf_cfg.ns)], x[n_pool:n_pool + inf_cfg.n_test]])
            yi = np.concatenate([y[:max(inf_cfg.ns)], y[n_pool:n_pool + inf_cfg.n_test]])

            def run_inf() -> list[Row]:
                r, data["influence"] = bench_influence(inf_cfg, xi, yi, _log)
                return r

            rows += _guard(ISEC, run_inf)
        if "attacks" in wanted:
            from benchmarks.bench_attacks import SECTION as ASEC

            rows += _guard(ASEC, lambda: _attacks(cfgs["attacks"], devices, data))
        if "scaling" in wanted:
            from benchmarks.bench_ntk import SCALING

            rows += _guard(SCALING, lambda: _scaling(cfgs, data))
        if "peers" in wanted:
            from benchmarks.bench_peers import SECTION as PSEC

            rows += _guard(PSEC, lambda: _peers(cfgs["peers"], a.peers_python, x, y, threads, data))
        if "precision" in wanted:
            from benchmarks.bench_precision import SECTION as PRSEC
            from benchmarks.bench_precision import bench_precision

            _log("section 7: precision of the fast paths")

            def run_prec() -> list[Row]:
                r, data["precision"] = bench_precision(cfgs["precision"], x[:n_pool], y[:n_pool], _log)
                return r

            rows += _guard(PRSEC, run_prec)
        if "stages" in wanted:
            from benchmarks.bench_stages import SECTION as SSEC
            from benchmarks.bench_stages import bench_stages

            _log("section 8: per-stage times at the presets")

            def run_stages() -> list[Row]:
                r, data["stages"] = bench_stages(cfgs["stages"], x, y, _log)
                return r

            rows += _guard(SSEC, run_stages)
    from benchmarks.bench_presets import SECTION as RSEC

    if "presets" in wanted:
        rows += _guard(RSEC, lambda: _presets(a.with_quick, data))
    if "audit" in wanted:
        rows += _guard(RSEC, lambda: _audit(data))
    env["load_average_end"] = load_average()
    env["load_average_by_section"] = dict(LOAD_BY_SECTION)
    wall = time.perf_counter() - t_start
    heads = headline(data, cfgs)
    md = render_markdown(rows, env, heads, wall)
    if "stages" in data:
        from benchmarks.bench_stages import share_table

        md += ("\n### 8b. Share of each stage in one unit of work (from the rows above)\n\n"
               + share_table(data["stages"]) + "\n")
    print(md)
    status = exit_status(rows)
    command = " ".join(["python -m benchmarks", *(argv if argv is not None else sys.argv[1:])])
    record = {
        "command": command,
        "environment": env, "quick": a.quick, "sections": wanted, "wall_s": wall, "exit_status": status,
        "headline": heads, "rows": [r.to_dict() for r in rows],
        "data": {k: _public(v) for k, v in data.items()},
        "config": {k: _public(v.__dict__) for k, v in cfgs.items()},
    }
    from ntkm.codec import write_json
    from ntkm.io import atomic_write_text

    if a.json:
        write_json(a.json, record)
        _log(f"wrote {a.json}")
    if a.markdown:
        atomic_write_text(a.markdown, f"# Benchmark results\n\nCommand: `{command}` (benchmarks/README.md explains "
                                      f"every row).\n\n{md}\n")
        _log(f"wrote {a.markdown}")
    _log(f"benchmarks finished in {fmt_time(wall)}; exit status {status}")
    if a.compare:
        from benchmarks.compare import compare_records, load_record

        text, code = compare_records(load_record(a.compare), record, a.compare, a.json or "this run")
        print("\n" + text)
        status = status or code
    return status


def _public(obj: Any) -> Any:
    """Drop private (underscore) keys and stringify non-JSON keys, recursively."""
    if isinstance(obj, dict):
        return {str(k): _public(v) for k, v in obj.items() if not str(k).startswith("_")}
    if isinstance(obj, (list, tuple)):
        return [_public(v) for v in obj]
    return obj


def _attacks(cfg: Any, devices: tuple[str, ...], data: dict[str, Any]) -> list[Row]:
    from benchmarks.bench_attacks import bench_attacks
    from empirics.data.datasets import DataRequest, load_dataset

    _log("section 3: attacks and the malleability loop")
    c = cfg.resolved()
    ds = load_dataset("mnist", n_train=c.n_train, n_test=c.n_test, request=DataRequest(sample="balanced", seed=0))
    x = np.concatenate([ds.x_train, ds.x_test]).astype(np.float32)
    y = np.concatenate([ds.y_train, ds.y_test]).astype(np.int64)
    r, data["attacks"] = bench_attacks(c, x, y, devices, _log)
    return r


def _scaling(cfgs: dict[str, Any], data: dict[str, Any]) -> list[Row]:
    from benchmarks.bench_influence import influence_scaling_rows
    from benchmarks.bench_ntk import scaling_rows

    _log("section 4: scaling")
    rows: list[Row] = []
    if "ntk" in data:
        rows += scaling_rows(cfgs["ntk"], data["ntk"])
    if "influence" in data:
        rows += influence_scaling_rows(cfgs["influence"], data["influence"])
    return rows


def _peers(cfg: Any, python: str | None, x: np.ndarray, y: np.ndarray, threads: int,
           data: dict[str, Any]) -> list[Row]:
    from benchmarks.bench_peers import bench_peers

    _log("section 5: peers")
    cfg.python = python
    rows, d = bench_peers(cfg, x, y, threads, _log)
    d["rows"] = [f"{r.bench} ({r.case}): {fmt_time(r.data['peer_s'])} vs the suite's {fmt_time(r.data['suite_s'])} "
                 f"({r.ratio}; {'; '.join(c.render() for c in r.checks if c.gated)})"
                 for r in rows if r.final_status == "measured" and "peer_s" in r.data
                 and (r.data.get("same_estimand", True) or r.bench.startswith("kronfluence"))]
    data["peers"] = d
    return rows


def _presets(with_quick: bool, data: dict[str, Any]) -> list[Row]:
    from benchmarks.bench_presets import SECTION, bench_claims

    _log("section 6: presets end to end")
    rows = [bench_claims("smoke", log=_log)]
    data["presets_smoke"] = f"`verify claims --preset smoke`: {rows[0].time_text()} ({rows[0].final_status})"
    if with_quick:
        rows.append(bench_claims("quick", log=_log))
        data["presets_quick"] = f"`verify claims --preset quick`: {rows[-1].time_text()} ({rows[-1].final_status})"
    else:
        rows.append(Row(SECTION, "verify claims --preset quick", "-",
                        status="skipped: behind --with-quick (takes up to ~30 min)"))
    return rows


def _audit(data: dict[str, Any]) -> list[Row]:
    from benchmarks.bench_presets import bench_audit

    _log("section 6: audit")
    row = bench_audit(log=_log)
    data["audit"] = f"`verify audit` (benchmarks/bench_audit.py, export format): {row.time_text()} ({row.final_status})"
    return [row]


if __name__ == "__main__":
    sys.exit(main())
