"""`verify audit`: a PDF audit of training-data malleability risk for the user's own classifier.

Exit codes: 0 success; 2 bad input (one line on stderr, no traceback, no output files written);
3 the PDF could not be made because weasyprint or its system libraries are missing (one line on
stderr; the HTML report, and the JSON with --json, are written anyway); 4 the risk level reached
`--fail-on` (every output was written; takes precedence over 3).

`verify audit diff OLD.json NEW.json` compares two saved records (`verify.audit.ci`): exit 0 when nothing
moved beyond its interval, 5 when something did, 2 for a file that is not an audit record.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

import jinja2

from ntkm.errors import UserInputError
from verify.audit.ci import (
    DIFF_MOVED_EXIT,
    FAIL_LEVELS,
    FAIL_ON_EXIT,
    diff_records,
    diff_text,
    reaches,
    read_record,
)
from verify.audit.config import AUDIT_ATTACKS, PANELS, PEERS, AuditConfig
from verify.audit.files import attributions_name, output_members, summary_name, write_outputs
from verify.audit.pipeline import run_audit
from verify.audit.record import parse_record
from verify.commands.options import Param, choices, options, values
from verify.outputs import check_members, check_output_dir
from verify.presets import parse_choices

NAME = "audit"
HELP = "audit a trained PyTorch classifier for training-data malleability risk (PDF report)"
ORDER = 70
DESCRIPTION = (
    "If someone altered a few of your training examples, how much would what your model relies on change, and "
    "which examples are the levers? Loads a TorchScript file, a torch.export program (.pt2) or suite weights "
    "(safetensors / state dict + spec JSON) without running pickled code, measures influence (NTK leave-one-out "
    "and Gauss-Newton), flip rates under FGSM / PGD / MIM against a random-noise baseline, kernel-regime "
    "diagnostics and sharpness, compares with the paper's 2L-ReLU and MLP-Attn trained on the same data, and "
    "writes a PDF. 'verify audit diff OLD.json NEW.json' compares two saved audits. Exit codes: 0 ok, 2 bad input, "
    "3 PDF unavailable (HTML written), 4 risk reached --fail-on, 5 (diff) something moved beyond its interval."
)


@dataclass(frozen=True)
class AuditCommandOptions:
    """`verify audit`'s options that are not the audit's settings (`AuditConfig`): the action and the outputs."""

    action: list[str] = field(default_factory=list, metadata={
        "help": "compare two saved audit records (--json): what moved beyond its interval (exit 0 nothing, 5 "
                "something)", "positional": True, "nargs": "*", "metavar": "diff OLD.json NEW.json"})
    out: str = field(default="audit.pdf", metadata={"help": "PDF to write (default: %(default)s)"})
    html: bool = field(default=False, metadata={"help": "also write the HTML report beside the PDF"})
    json: bool = field(default=False, metadata={"help": "also write every number as JSON beside the PDF"})
    summary: bool = field(default=False, metadata={
        "help": "also write a Markdown summary for a pull-request comment beside the PDF (OUT-summary.md)"})
    attributions: bool = field(default=False, metadata={
        "help": "also export the lead estimator's influence of every training point on every test point's loss "
                "(training x test; positive: the point helps) with the labels and the levers, as OUT-attributions.npz "
                "(plain arrays: np.load without pickle)"})
    fail_on: str | None = field(default=None, metadata={
        "help": f"exit {FAIL_ON_EXIT} (after writing every output) when the risk level reaches medium or high, or "
                "when no level could be issued (not measurable, not validated) (default: never)",
        "choices": FAIL_LEVELS})
    render: str | None = field(default=None, metadata={
        "help": "only re-render the report from a saved audit JSON (--json), computing nothing", "metavar": "JSON"})


def _panels(skip: str) -> tuple[str, ...]:
    """The panels that `--skip` leaves."""
    left_out = parse_choices(skip, "--skip", PANELS) if skip.strip() else ()
    return tuple(p for p in PANELS if p not in left_out)


def _peers(text: str) -> tuple[str, ...]:
    """The library estimators `--peers` names (`none`: no library estimator)."""
    return () if text.strip().lower() == "none" else parse_choices(text, "--peers", PEERS)


CONFIG = options(
    AuditConfig, "model", "train", "test", "spec", "input_shape", "eps", "tau",
    Param("attacks", parse=choices("--attack", AUDIT_ATTACKS)),
    "n", "n_test", "steps", "baseline_seeds", "reference", "ref_width", "ref_epochs", "hessian_iters",
    "hessian_points", "bound_eps", "top_k", "seed", "max_memory_gb", "projection_dim", "projection_kind", "data_dir",
    Param("panels", default="", parse=_panels),
    "refit_epochs", "refit_lr", "refit_batch", "train_fn", "lds_subsets", "lds_max_subsets", "lds_repeats",
    "lds_fraction", "lds_seeds", "ensemble",
    "refit_seeds", Param("peers", parse=_peers),
    "outcome_targets", "target_test", "poison_fraction", "curve_attack", "device", "refit_stack", "refit_workers",
)
ACTION, *OUTPUTS = options(AuditCommandOptions, "action", "out", "html", "json", "summary", "attributions", "fail_on",
                          "render")
OPTIONS = (ACTION, *CONFIG, *OUTPUTS)


def config_from_args(args: argparse.Namespace) -> AuditConfig:
    return AuditConfig(**values(CONFIG, args))


def run_diff(args: argparse.Namespace) -> int:
    """`verify audit diff OLD.json NEW.json`."""
    if len(args.action) != 3 or args.action[0] != "diff":
        raise UserInputError(f"unknown action '{' '.join(args.action)}'; the only action is 'diff OLD.json NEW.json' "
                             "(an audit takes --model and --train)")
    if args.model is not None or args.train is not None or args.render is not None:
        raise UserInputError("'verify audit diff' takes two audit JSON files and no --model / --train / --render")
    old, new = read_record(args.action[1], "OLD"), read_record(args.action[2], "NEW")
    d = diff_records(old, new)
    print(diff_text(d, args.action[1], args.action[2]), end="")
    return DIFF_MOVED_EXIT if d["moved"] else 0


def run(args: argparse.Namespace) -> int:
    if args.action:
        return run_diff(args)
    if args.render is None and (args.model is None or args.train is None):
        raise UserInputError("--model and --train are required (or --render JSON to re-render a saved audit)")
    out = Path(args.out).expanduser()
    if out.suffix.lower() != ".pdf":
        raise UserInputError(f"--out {out} must end in .pdf (the HTML and JSON are written beside it)")
    if out.exists() and out.is_dir():
        raise UserInputError(f"--out {out} is a folder; give a file name ending in .pdf")
    if not out.parent.exists():
        raise UserInputError(f"--out {out}: folder {out.parent} does not exist")
    check_output_dir(out.parent, "--out")
    pdf_name, html_name, json_name, md_name = output_members(out)
    check_members(out.parent, [pdf_name, *[n for n, on in ((html_name, args.html), (json_name, args.json),
                                                          (md_name, args.summary),
                                                          (attributions_name(out), args.attributions)) if on]])
    if args.render:
        result = read_record(args.render, "--render", schema=False)
        try:
            code = write_outputs(result, out, html=args.html, json_out=args.json, summary=args.summary,
                                 attributions=args.attributions)
        except (KeyError, TypeError, AttributeError, ValueError, IndexError, jinja2.UndefinedError) as exc:
            raise UserInputError(f"--render {args.render} lacks fields this version draws ({exc}); rerun the "
                                 "audit") from None
    else:
        result = run_audit(config_from_args(args))
        code = write_outputs(result, out, html=args.html, json_out=args.json, summary=args.summary,
                             attributions=args.attributions)
    record = parse_record(result)
    risk, user = record.risk, record.user
    written = [str(out)] if code == 0 else []
    written += [str(out.with_suffix(".html"))] if (args.html or code) else []
    written += [str(out.with_suffix(".json"))] if args.json else []
    written += [str(out.with_name(summary_name(out)))] if args.summary else []
    written += [str(out.with_name(attributions_name(out)))] if args.attributions else []
    print(f"malleability risk: {risk.level.upper()} — worst-case flip rate {100 * user.worst_flip_rate:.1f}% "
          f"({user.worst_attack.upper()}), random noise {100 * user.baseline.mean:.1f}% ± "
          f"{100 * user.baseline.std:.1f}%, references {100 * risk.relu_reference:.1f}% (2L-ReLU) / "
          f"{100 * risk.attn_reference:.1f}% (MLP-Attn)")
    panels = record.panels
    extra = []
    if panels.validity is not None and panels.validity.verdict:
        edge = f" ({panels.validity.stability.label})" if panels.validity.knife_edge else ""
        extra.append(f"influence {panels.validity.verdict}{edge} against re-fits")
    if panels.budget is not None and panels.budget.breaking_label:
        extra.append(f"breaking budget {panels.budget.breaking_label}")
    po = panels.poison
    if po is not None and po.rankings:
        extra.append(f"planted poison precision at {po.k}: {100 * po.rankings[po.headline].precision:.0f}% "
                     f"(chance {100 * po.chance:.0f}%)")
    if extra:
        print("; ".join(extra))
    print("wrote " + ", ".join(written))
    if reaches(risk.level, args.fail_on):
        sys.stderr.write(f"verify audit: risk {risk.level.upper()} reaches --fail-on {args.fail_on} "
                         f"(exit {FAIL_ON_EXIT})\n")
        return FAIL_ON_EXIT
    return code
