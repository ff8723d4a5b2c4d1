"""`verify audit`: a PDF audit of training-data malleability risk for the user's own classifier.

Exit codes: 0 success; 2 bad input (one line on stderr, no traceback, no output files written);
3 the PDF could not be made because weasyprint or its system libraries are missing (one line on
stderr; the HTML report, and the JSON with --json, are written anyway); 4 the risk level reached
`--fail-on` (every output was written; takes precedence over 3).

`verify audit diff OLD.json NEW.json` compares two saved records (`verify.audit_ci`): exit 0 when nothing
moved beyond its interval, 5 when something did, 2 for a file that is not an audit record.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jinja2

from empirics.audit_ntk import PROJECTION_KINDS
from theory.errors import UserInputError
from verify.audit import PANELS, AuditConfig, check_record, load_record, run_audit, summary_name, write_outputs
from verify.audit_budget import REALISTIC_EPS
from verify.audit_ci import DIFF_MOVED_EXIT, FAIL_LEVELS, FAIL_ON_EXIT, diff_records, diff_text, reaches, read_record
from verify.audit_projection import AUTO_DIM
from verify.outputs import check_output_dir
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


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", nargs="*", metavar="diff OLD.json NEW.json", help="compare two saved audit records "
                   "(--json): what moved beyond its interval (exit 0 nothing, 5 something)")
    p.add_argument("--model", default=None, help="TorchScript file, torch.export .pt2, or weights (safetensors / "
                   "torch.save state dict) with a spec JSON")
    p.add_argument("--train", default=None, help=".npz with arrays x, y; an MNIST IDX or CIFAR-10 folder; an image "
                   "folder ROOT/train/<class>/*; or mnist / cifar10")
    p.add_argument("--test", default=None, help="test data in the same forms (default: the test split of --train)")
    p.add_argument("--spec", default=None, help="architecture spec JSON for weights (default: MODEL.json)")
    p.add_argument("--input-shape", default=None, help="per-example input shape, e.g. 1,28,28 (default: inferred)")
    p.add_argument("--eps", type=float, default=REALISTIC_EPS, help="perturbation budget per pixel, inputs in "
                   "[0, 1] (default: 8/255, a budget that leaves an image looking like the original)")
    p.add_argument("--tau", type=float, default=0.1, help="fraction of training points perturbed, the top by "
                   "|influence| (default: %(default)s)")
    p.add_argument("--attack", default="fgsm,pgd,mim", help="comma-separated: fgsm, pgd, mim (default: %(default)s)")
    p.add_argument("--n", type=int, default=1000, help="training points audited, a seeded subset "
                   "(default: %(default)s)")
    p.add_argument("--n-test", type=int, default=200, help="test points (default: %(default)s)")
    p.add_argument("--steps", type=int, default=10, help="PGD / MIM steps (default: %(default)s)")
    p.add_argument("--baseline-seeds", type=int, default=3, help="random-noise repetitions (default: %(default)s)")
    p.add_argument("--no-reference", action="store_true", help="skip training the 2L-ReLU / MLP-Attn references "
                   "(the paper-reported scale is used)")
    p.add_argument("--ref-width", type=int, default=512, help="width of the reference networks (default: %(default)s)")
    p.add_argument("--ref-epochs", type=int, default=1000, help="maximum training epochs of the references, "
                   "trained to a plateau with the width-consistent protocol (default: %(default)s)")
    p.add_argument("--hessian-iters", type=int, default=20, help="power iterations for the top Hessian eigenvalue "
                   "(default: %(default)s)")
    p.add_argument("--bound-eps", type=float, default=0.1, help="NTK accuracy eps in the v1 / ReLU width bounds "
                   "(default: %(default)s)")
    p.add_argument("--top-k", type=int, default=12, help="lever examples shown (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of subsets, attacks and references (default: %(default)s)")
    p.add_argument("--max-memory-gb", type=float, default=2.0, help="memory budget for Jacobians "
                   "(default: %(default)s)")
    p.add_argument("--projection-dim", type=int, default=None, metavar="K", help="project per-example gradients to "
                   "K dimensions (0: the exact kernel; default: exact while all Jacobians fit --max-memory-gb, else "
                   f"{AUTO_DIM})")
    p.add_argument("--projection", default="gaussian", choices=PROJECTION_KINDS, help="entries of the random "
                   "projection (default: %(default)s)")
    p.add_argument("--data-dir", default=None, help="where the built-in data sets are found (default: automatic)")
    p.add_argument("--skip", default="", help="panels to leave out, comma-separated: budget, poison, validity, "
                   "outcome (default: none)")
    p.add_argument("--refit-epochs", type=int, default=5, help="epochs of each warm-start re-fit (default: "
                   "%(default)s)")
    p.add_argument("--refit-lr", type=float, default=1e-3, help="Adam learning rate of the warm-start re-fits "
                   "(default: %(default)s)")
    p.add_argument("--refit-batch", type=int, default=64, help="batch size of the warm-start re-fits "
                   "(default: %(default)s)")
    p.add_argument("--train-fn", default=None, metavar="MODULE:FUNCTION", help="re-fit from scratch with your own "
                   "training recipe: FUNCTION(x, y, seed) -> trained nn.Module; MODULE is a module name or a .py "
                   "path. This imports and runs YOUR code (default: warm start from the saved weights)")
    p.add_argument("--lds-subsets", type=int, default=24, help="random subsets (re-fits) of the linear "
                   "datamodeling score (default: %(default)s)")
    p.add_argument("--lds-fraction", type=float, default=0.1, help="fraction of training points each LDS subset "
                   "leaves out (default: %(default)s)")
    p.add_argument("--refit-seeds", type=int, default=3, help="re-fit seeds of the outcome table and the re-fit "
                   "noise (default: %(default)s)")
    p.add_argument("--outcome-targets", type=int, default=20, help="targeted test predictions in the outcome "
                   "table (default: %(default)s)")
    p.add_argument("--target-test", type=int, default=None, help="test point of the brittleness check "
                   "(default: a correctly predicted one of median margin)")
    p.add_argument("--poison-fraction", type=float, default=0.05, help="fraction of training points planted as "
                   "poison in the self-test (default: %(default)s)")
    p.add_argument("--curve-attack", default="pgd", help="attack of the budget curves (default: %(default)s)")
    p.add_argument("--out", default="audit.pdf", help="PDF to write (default: %(default)s)")
    p.add_argument("--html", action="store_true", help="also write the HTML report beside the PDF")
    p.add_argument("--json", action="store_true", help="also write every number as JSON beside the PDF")
    p.add_argument("--summary", action="store_true", help="also write a Markdown summary for a pull-request "
                   "comment beside the PDF (OUT-summary.md)")
    p.add_argument("--fail-on", default=None, choices=FAIL_LEVELS, help=f"exit {FAIL_ON_EXIT} (after writing every "
                   "output) when the risk level reaches medium or high (default: never)")
    p.add_argument("--render", default=None, metavar="JSON", help="only re-render the report from a saved audit "
                   "JSON (--json), computing nothing")


def config_from_args(args: argparse.Namespace) -> AuditConfig:
    attacks = parse_choices(args.attack, "--attack", ("fgsm", "pgd", "mim"))
    skip = parse_choices(args.skip, "--skip", PANELS) if args.skip.strip() else []
    return AuditConfig(
        model=args.model, train=args.train, test=args.test, spec=args.spec, input_shape=args.input_shape,
        eps=args.eps, tau=args.tau, attacks=tuple(attacks), n=args.n, n_test=args.n_test, steps=args.steps,
        baseline_seeds=args.baseline_seeds, reference=not args.no_reference, ref_width=args.ref_width,
        ref_epochs=args.ref_epochs, top_k=args.top_k, hessian_iters=args.hessian_iters,
        bound_eps=args.bound_eps, seed=args.seed, max_memory_gb=args.max_memory_gb,
        data_dir=args.data_dir, panels=tuple(p for p in PANELS if p not in skip), refit_epochs=args.refit_epochs,
        refit_lr=args.refit_lr, refit_batch=args.refit_batch, train_fn=args.train_fn, lds_subsets=args.lds_subsets,
        lds_fraction=args.lds_fraction, refit_seeds=args.refit_seeds, outcome_targets=args.outcome_targets,
        target_test=args.target_test, poison_fraction=args.poison_fraction, curve_attack=args.curve_attack,
        projection_dim=args.projection_dim, projection_kind=args.projection,
    )


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
    if args.render:
        result = load_record(args.render)
        check_record(result, args.render)
        try:
            code = write_outputs(result, out, html=args.html, json_out=args.json, summary=args.summary)
        except (KeyError, TypeError, AttributeError, ValueError, IndexError, jinja2.UndefinedError) as exc:
            raise UserInputError(f"--render {args.render} lacks fields this version draws ({exc}); rerun the "
                                 "audit") from None
    else:
        result = run_audit(config_from_args(args))
        code = write_outputs(result, out, html=args.html, json_out=args.json, summary=args.summary)
    risk = result["risk"]
    user = result["models"]["user"]
    written = [str(out)] if code == 0 else []
    written += [str(out.with_suffix(".html"))] if (args.html or code) else []
    written += [str(out.with_suffix(".json"))] if args.json else []
    written += [str(out.with_name(summary_name(out)))] if args.summary else []
    print(f"malleability risk: {risk['level'].upper()} — worst-case flip rate {100 * user['worst_flip_rate']:.1f}% "
          f"({user['worst_attack'].upper()}), random noise {100 * user['baseline']['mean']:.1f}% ± "
          f"{100 * user['baseline']['std']:.1f}%, references {100 * risk['relu_reference']:.1f}% (2L-ReLU) / "
          f"{100 * risk['attn_reference']:.1f}% (MLP-Attn)")
    panels = result.get("panels", {})
    extra = []
    if panels.get("validity", {}).get("verdict"):
        extra.append(f"influence {panels['validity']['verdict']} against re-fits")
    if panels.get("budget", {}).get("breaking_label"):
        extra.append(f"breaking budget {panels['budget']['breaking_label']}")
    if panels.get("poison", {}).get("rankings"):
        po = panels["poison"]
        extra.append(f"planted poison precision at {po['k']}: {100 * po['rankings'][po['headline']]['precision']:.0f}% "
                     f"(chance {100 * po['chance']:.0f}%)")
    if extra:
        print("; ".join(extra))
    print("wrote " + ", ".join(written))
    if reaches(risk["level"], args.fail_on):
        sys.stderr.write(f"verify audit: risk {risk['level'].upper()} reaches --fail-on {args.fail_on} "
                         f"(exit {FAIL_ON_EXIT})\n")
        return FAIL_ON_EXIT
    return code
