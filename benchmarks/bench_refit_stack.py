"""The audit's warm re-fits stacked (`--refit-stack on`) against one at a time (`off`), on one device.

On a model of the audit tables (`--model cnn|resnet18`, `benchmarks.audit_tables.build`: untrained weights in
evaluation mode, where a warm re-fit costs what a trained one does; exported to a `.pt2` and read back with the audit's
own loader, so that the re-fits train the graph the audit trains), `--k` warm re-fits of `--keep` of `--n` images
(the validity panel's subsets: `--epochs` epochs, batch 64, Adam at the audit's rate for that model), each path timed
on the same jobs after a warm-up (one job; two, stacked), beside the agreement of the two paths: the largest relative
difference of the re-fitted test logits (float32 rounding, amplified by the Adam steps). The stack's memory budget is
`--stack-gb`, not the audit's default `--max-memory-gb` (2 GiB, sized for a 2-core machine, which stacks no two
copies of the ResNet-18 at batch 64: ~3.4 GiB each with their activations), so that the stacked path is what is
measured; the record says how many copies one stack held and, if the stacked path fell back, why.

This measures what the audit's `--refit-stack auto` (stack on CUDA, not on the CPU: `verify.audit.refit`) rests on
for a GPU, where it has not been measured; the device check runs it before its ResNet-18 audit
(`benchmarks.gpu_check`, section `refit_stack`).

    python -m benchmarks.bench_refit_stack [--model resnet18] [--device cuda] [--k 8] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.audit_tables import FULL, RESNET_AUDIT_GPU, build, export_program, load_images
from benchmarks.harness import environment, max_rel_diff, sync_device
from verify.audit.modelio import FlatInput, load_model
from verify.audit.refit import RefitConfig, RefitJob, Refitter

#: Largest relative difference of the test logits at which the two paths count as the same re-fits: float32
#: rounding amplified by the Adam steps of an epoch or two (the CPU test holds them to 1e-4 on small models;
#: a deep network amplifies more, as `bench_refit_workers`' layouts do).
AGREEMENT_TOLERANCE = 1e-2


@dataclass(frozen=True)
class Sizes:
    """`k` re-fits of `keep` of `n` training images, `epochs` each, scored on `n_test` test images."""

    k: int = 8
    keep: int = 900
    n: int = 1000
    n_test: int = 200
    epochs: int = 1


def _jobs(model_name: str, device: str, sizes: Sizes) -> tuple[torch.nn.Module, tuple[int, ...], list[RefitJob]]:
    """The model as the audit reads it (on `device`), its input shape, and the re-fits of `sizes`."""
    k, keep, n, n_test = sizes.k, sizes.keep, sizes.n, sizes.n_test
    x, y, xt, _, _ = load_images(replace(FULL[model_name], n=n, n_test=n_test))
    shape = tuple(x.shape[1:])
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.pt2"
        export_program(build(model_name), torch.as_tensor(x[:4]), path)
        model = load_model(path).module.to(device)
    xf = torch.as_tensor(x.reshape(len(x), -1), device=device)
    yf = torch.as_tensor(y, device=device).long()
    xtf = torch.as_tensor(xt.reshape(len(xt), -1), device=device)
    rng = np.random.default_rng(0)
    jobs = [RefitJob(xf, yf, s, {"test": xtf},
                     torch.as_tensor(np.sort(rng.choice(len(x), keep, replace=False)), device=device))
            for s in range(k)]
    return model, shape, jobs


def measure(model_name: str = "resnet18", device: str = "cpu", sizes: Sizes = Sizes(),
            stack_gb: float = 32.0) -> dict[str, Any]:
    """Both paths on the same jobs: seconds per re-fit, speed-up, agreement, and the stacked path's record."""
    model, shape, jobs = _jobs(model_name, device, sizes)
    k, epochs = sizes.k, sizes.epochs
    lr = RESNET_AUDIT_GPU["refit_lr"] if model_name == "resnet18" else RefitConfig().lr
    out: dict[str, Any] = {"model": FULL[model_name].label, "device": device, **asdict(sizes), "lr": lr,
                           "stack_gb": stack_gb, "parameters": sum(p.numel() for p in model.parameters())}
    outs: dict[str, np.ndarray] = {}
    for mode in ("off", "on"):
        cfg = RefitConfig(epochs=epochs, lr=lr, stack=mode, stack_bytes=int(stack_gb * 2**30), workers=1)
        refitter = Refitter.for_module(model, FlatInput(model, shape), cfg, 10, shape)
        refitter.outputs_many(jobs[:2] if mode == "on" else jobs[:1])  # warm-up (the stack's first call traces)
        refitter.count = refitter.stacked_count = 0  # the record counts the timed re-fits only
        sync_device(device)
        t0 = time.perf_counter()
        res = refitter.outputs_many(jobs)
        sync_device(device)
        out[f"{mode}_s_per_refit"] = (time.perf_counter() - t0) / k
        outs[mode] = np.stack([o["test"] for o in res])
        if mode == "on":
            out["stacked_path"] = refitter.describe_path()
            out["stack_size"] = refitter._stack_size
    out["speedup_stacked"] = out["off_s_per_refit"] / out["on_s_per_refit"]
    out["max_rel_diff"] = max_rel_diff(outs["on"], outs["off"])
    out["agree"] = bool(out["max_rel_diff"] <= AGREEMENT_TOLERANCE)
    out["stacked"] = bool(out["stacked_path"]["stacked"])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_refit_stack", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=("cnn", "resnet18"), default="resnet18")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--k", type=int, default=8, help="re-fits per path (default %(default)s)")
    ap.add_argument("--keep", type=int, default=900, help="training points of each re-fit (default %(default)s)")
    ap.add_argument("--n", type=int, default=1000, help="images the subsets are drawn from (default %(default)s)")
    ap.add_argument("--epochs", type=int, default=1, help="epochs of each re-fit (default %(default)s)")
    ap.add_argument("--stack-gb", type=float, default=32.0, help="memory budget of one stack (default %(default)s)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("bench_refit_stack: --device cuda but torch sees no GPU; use --device cpu", file=sys.stderr)
        return 2
    if not (2 <= args.k and 1 <= args.keep <= args.n and args.epochs >= 1 and args.stack_gb > 0):
        print("bench_refit_stack: need --k >= 2, 1 <= --keep <= --n, --epochs >= 1 and --stack-gb > 0",
              file=sys.stderr)
        return 2
    res = measure(args.model, args.device, Sizes(args.k, args.keep, args.n, epochs=args.epochs), args.stack_gb)
    print(f"{res['model']} on {args.device}: one at a time {res['off_s_per_refit']:.3f} s, stacked "
          f"{res['on_s_per_refit']:.3f} s per re-fit ({res['speedup_stacked']:.2f}x; {res['stack_size']} per stack; "
          f"{res['stacked_path']['reason']}); max relative difference {res['max_rel_diff']:.1e}")
    if args.json:
        tmp = Path(args.json).with_suffix(".tmp")
        tmp.write_text(json.dumps({"what": __doc__.split("\n\n")[0], "config": vars(args),
                                   "environment": environment(), "result": res}, indent=1, default=str))
        tmp.replace(args.json)
    return 0 if res["agree"] else 1


if __name__ == "__main__":
    sys.exit(main())
