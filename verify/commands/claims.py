"""`verify claims`: regenerate the paper's claims table with our values and a verdict per claim."""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from empirics.nets.protocols import DESCRIPTIONS, GATE_TEXT
from empirics.precision import set_float32_math
from empirics.progress import log
from empirics.records import device_info, git_state, library_versions
from ntkm.codec import write_json
from ntkm.errors import UserInputError
from verify.claims import VERDICTS, all_claims, claim_row, claim_units, conditions
from verify.claims.base import not_run
from verify.claims.units import condition
from verify.commands._common import emit_json, json_target
from verify.commands.options import EXECUTOR, PRESET, DataOptions, Param, options
from verify.executors import ExecutorConfig, default_jobs, executor_from_args, run_units
from verify.experiments import not_run_units, units_for
from verify.multiplicity import ALPHA as MULTIPLICITY_ALPHA
from verify.multiplicity import METHOD as MULTIPLICITY_METHOD
from verify.multiplicity import across_claims
from verify.outputs import check_members
from verify.preregistration import preregistration
from verify.presets import preset
from verify.reproducibility import knife_edges, reproducibility_block
from verify.runner import Cache
from verify.stability import N_RESAMPLES, Resampling, RunConditions, stability, stability_block

NAME = "claims"
HELP = "regenerate every claim of the paper with our value, its spread and an honest verdict"
ORDER = 5
DESCRIPTION = (HELP + ". Writes claims.md, claims.json, claims.html and claims.pdf to --out; finished "
               "experiments are cached under --out/cache and reused with --resume.")


@dataclass(frozen=True)
class ClaimsOptions:
    """`verify claims`'s own options."""

    only: str | None = field(default=None, metadata={"help": "comma-separated claim ids (see --list)"})
    out: str = field(default="claims_out", metadata={"help": "output folder (default: %(default)s)"})
    resume: bool = field(default=False, metadata={"help": "reuse finished experiments cached in --out/cache"})
    list: bool = field(default=False, metadata={"help": "list the claim ids and exit"})
    no_pdf: bool = field(default=False, metadata={"help": "skip the PDF (Markdown, JSON and HTML only)"})
    device: str | None = field(default=None, metadata={
        "help": "device of every unit that trains networks: cpu or cuda (default: auto, CUDA when visible; a given "
                "device is part of each unit's config and cache key)"})
    jobs: int | None = field(default=None, metadata={
        "metavar": "N", "help": "worker processes of the local executor, each running whole units (default: the "
                                "usable cores, fewer when memory is short; 1: one unit after another here)"})
    plan: bool = field(default=False, metadata={
        "help": "list every unit the run would compute (honouring --only, --preset, --resume), its config and "
                "estimated time, and the estimated wall time with --jobs; trains nothing"})
    json: str | None = field(default=None, metadata={
        "metavar": "FILE", "help": "with --plan: also write the plan as JSON to FILE, atomically ('-': only the "
                                   "JSON, to stdout)"})


#: The files and folders of one run's output set (`verify.outputs`; `figures/` is merged, never replaced).
CLAIMS_MEMBERS = ("claims.json", "claims.md", "claims.html", "claims.pdf", "figures")
OPTIONS = (PRESET, *options(ClaimsOptions, "only", "out", "resume"), *options(DataOptions, "data_dir"),
           *options(ClaimsOptions, "list", "no_pdf", "device", "jobs", "plan", Param("json", type=json_target)),
           *EXECUTOR)


def run(args: argparse.Namespace) -> int:
    claims = all_claims()
    if args.list:
        for c in claims:
            print(f"{c.id:<24} {c.source:<24} {c.statement}")
        return 0
    preset(args.preset)
    if args.device not in (None, "auto", "cpu") and not str(args.device).startswith("cuda"):
        raise UserInputError(f"unknown device '{args.device}'; choose cpu or cuda")
    set_float32_math()  # IEEE float32 products and convolutions on CUDA, here and in every worker
    executor = with_jobs(executor_from_args(args, args.device), args.jobs)
    if args.json is not None and not args.plan:
        raise UserInputError("--json writes the plan: add --plan (the run itself writes claims.json to --out)")
    if args.only:
        wanted = [s.strip() for s in args.only.split(",") if s.strip()]
        if not wanted:
            raise UserInputError(f"--only '{args.only}' names no claim; give comma-separated ids (see 'verify claims "
                                 "--list')")
        known = {c.id for c in claims}
        bad = [w for w in wanted if w not in known]
        if bad:
            raise UserInputError(f"unknown claim id '{','.join(bad)}'; see 'verify claims --list'")
        claims = [c for c in claims if c.id in wanted]
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UserInputError(f"--out {out} is a file; give a folder")
    check_members(out, [m for m in CLAIMS_MEMBERS if m != "figures" and not (args.no_pdf and m == "claims.pdf")],
                  ("figures", "cache"))
    cache = Cache(out / "cache")
    if cache.folder.is_dir():  # a cache that cannot take entries would lose every unit after its work: refuse now
        from verify.outputs import check_output_dir

        check_output_dir(cache.folder, "--out's cache folder")
    units = units_for(args.preset, args.data_dir, args.device)
    pres = tuple(preset(args.preset)["preprocessings"])
    protos = tuple(preset(args.preset)["protocols"])
    wanted = {u for c in claims for u in claim_units(c, pres, protos)}
    skipped = {u: why for u, why in not_run_units(args.preset, args.data_dir, args.device).items() if u in wanted}
    needed = sorted(wanted - skipped.keys(), key=list(units).index)
    if args.plan:
        return show_plan(args, claims, [units[n] for n in needed], cache if args.resume else None, executor.jobs,
                         skipped)
    if not args.resume:
        drop_cache_entries(cache.folder)
    t0 = time.perf_counter()
    git = git_state()  # the code that runs is the code checked out now
    prereg = preregistration(args.preset)  # before any unit: a malformed docs/DEVIATIONS.md stops the run here
    ran = run_units([units[n] for n in needed], cache, log, executor)
    results: dict[str, Any] = {**{u: not_run(why) for u, why in skipped.items()},
                               **{name: res.payload for name, (res, _) in ran.items()}}
    unit_meta: dict[str, Any] = {name: {"cached": cached, "wall_s": res.unit_wall_s, "config": res.unit_config}
                                 for name, (res, cached) in ran.items()}
    rows = [claim_row(c, results, pres, protos) for c in claims]
    edges = knife_edges(lambda res: [claim_row(c, res, pres, protos) for c in claims], results, rows)
    t_st = time.perf_counter()
    n_resamples = preset(args.preset).get("stability_resamples", N_RESAMPLES)
    seed_stability = stability(claims, results, RunConditions(pres, protos), rows, Resampling(n=n_resamples))
    adjusted = across_claims(rows)
    rows = [{**r, "stability": seed_stability[r["id"]], "multiplicity": adjusted.get(r["id"])} for r in rows]
    stability_s = time.perf_counter() - t_st
    log(f"seed stability: {n_resamples} seed resamples and leave-one-seed-out in {stability_s:.0f} s")
    record = {
        "title": "Claims of arXiv:2603.13085 — regenerated",
        "preset": args.preset,
        "preset_sizes": preset(args.preset),
        "generated": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "code_version": cache.version,
        "git": git,
        "versions": library_versions(),
        "device": device_info(),
        "executor": {"name": executor.name, "address": executor.address, "cpus_per_unit": executor.cpus_per_unit,
                     "gpus_per_unit": executor.gpus_per_unit, "jobs": executor.jobs},
        "wall_s": time.perf_counter() - t0,
        "summary": {v: sum(r["verdict"] == v for r in rows) for v in VERDICTS},
        "summary_by_protocol": {p: {v: sum(r["by_protocol"][p]["verdict"] == v for r in rows if r["empirical"])
                                    for v in VERDICTS} for p in protos},
        "summary_by_condition": {condition(*k): {v: sum(r["by_condition"][condition(*k)]["verdict"] == v
                                                        for r in rows if r["empirical"]) for v in VERDICTS}
                                 for k in conditions(pres, protos)},
        "preprocessings": list(pres),
        "protocols": protocol_descriptions(args.preset),
        "gate": GATE_TEXT,
        "preregistration": prereg,
        "reproducibility": reproducibility_block(edges),
        "stability": stability_block(n_resamples, wall_s=stability_s),
        "multiplicity": {"method": MULTIPLICITY_METHOD, "alpha": MULTIPLICITY_ALPHA},
        "claims": rows,
        "units": unit_meta,
        "results": {name: slim(res.to_dict()) for name, (res, _) in ran.items()},
    }
    from reports.claims_report import render_all
    from verify.outputs import output_set

    with output_set(out, CLAIMS_MEMBERS, folders=("figures",)) as staged:
        write_json(staged.path("claims.json"), record)
        written = render_all(record, staged.dir, pdf=not args.no_pdf)
    written.paths = [staged.final(p) for p in written.paths]
    print(f"{len(rows)} claims (headline: theory as checked, empirical rows under proper training): "
          f"{summary_line(record['summary'])} ({record['wall_s']:.0f} s, preset {args.preset})")
    names = [condition(*k) for k in conditions(pres, protos)]
    print("  " + "".join(f"{n:<36} " for n in names) + "claim")
    for r in rows:
        if r["empirical"]:
            split = ("  (underdetermined: preprocessing)" if r["preprocessing_split"] else
                     "  (underdetermined: schedule)" if r.get("schedule_split") else "")
            print("  " + "".join(f"{r['by_condition'][n]['label']:<36} " for n in names) + r["id"]
                  + ("  (robust)" if r["robust"] else split) + ("  fragile" if r["stability"].get("fragile") else ""))
        else:
            print(f"  {r['label']:<{37 * len(names) - 1}} {r['id']}")
    print("wrote " + ", ".join(str(p) for p in [out / "claims.json", *written]))
    return 0 if written.pdf_ok else 3


def with_jobs(ex: ExecutorConfig, jobs: int | None) -> ExecutorConfig:
    """The executor with `--jobs` workers (default: `default_jobs` for the local executor; Ray places units itself)."""
    if ex.name != "local":
        if jobs is not None:
            raise UserInputError("--jobs is for the local executor; with --executor ray each unit is a Ray task "
                                 "(size them with --cpus-per-unit)")
        return ex
    if jobs is not None and jobs < 1:
        raise UserInputError(f"--jobs must be a whole number >= 1, got {jobs}; e.g. --jobs 2 (1: one unit after "
                             "another)")
    import torch

    return dataclasses.replace(ex, jobs=jobs if jobs is not None else default_jobs(torch.get_num_threads()))


def show_plan(args: argparse.Namespace, claims: list[Any], units: list[Any], cache: Cache | None, jobs: int,
              skipped: dict[str, str] | None = None) -> int:
    """`--plan`: the table on stdout (unless the JSON goes there) and the JSON record with --json. `skipped`: the
    units the claims read that the preset does not run, with the reason (`not_run` in the record, where any)."""
    from verify import costs, plan

    pres = tuple(preset(args.preset)["preprocessings"])
    device = args.device or ("cuda" if args.preset == "gpu" else None)
    needed_by: dict[str, list[str]] = {}
    for c in claims:
        for u in claim_units(c, pres, preset(args.preset)["protocols"]):
            needed_by.setdefault(u, [])
            if c.id not in needed_by[u]:
                needed_by[u].append(c.id)
    record = {"preset": args.preset, "only": args.only, "resume": bool(args.resume),
              **plan.build(units, cache, jobs, needed_by, costs.prices_for(device)),
              **({"not_run": skipped} if skipped else {})}
    if args.json != "-":
        print(plan.text(record))
    emit_json(args.json, record)
    return 0


def drop_cache_entries(folder: Path) -> None:
    """Remove the suite's cache entries from `folder` (a fresh run without --resume); other files stay."""
    import json

    from ntkm.codec import read_json

    for f in folder.glob("*.json") if folder.is_dir() else ():
        try:
            entry = read_json(f, what="file in the cache folder")  # a named pipe there is refused, never read
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            continue
        if isinstance(entry, dict) and {"unit", "code_version", "result_sha256"} <= entry.keys():
            f.unlink()


def summary_line(s: dict[str, int]) -> str:
    """'10 hold, 3 partly, ...' over the verdicts that occur."""
    return ", ".join(f"{n} {v}" for v, n in s.items() if n)


def protocol_descriptions(preset_name: str) -> dict[str, Any]:
    """What the claims protocols are at this preset (recorded in claims.json and printed in the report)."""
    from verify.claims.base import claims_protocol
    from verify.experiments import protocol_train

    p = preset(preset_name)
    out = {}
    for name in p["protocols"]:
        cfg, cp = protocol_train(p, name), claims_protocol(name)
        text = DESCRIPTIONS[cfg["protocol"]]
        if cp.lr_power is not None:
            text += (f"; here at lr exponent {cp.lr_power:g} instead, each data set at its own piloted anchor (the "
                     f"schedule axis: compared with '{cp.varies}')")
        out[name] = {"protocol": cfg["protocol"], "description": text, "train": cfg}
    return out


def slim(result: dict[str, Any]) -> dict[str, Any]:
    """Drop bulky per-example arrays from a unit result before it goes into claims.json."""
    def walk(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items() if k not in ("examples", "per_example", "records")}
        if isinstance(v, list):
            return [walk(x) for x in v]
        return v

    return walk(result)


