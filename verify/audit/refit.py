"""Re-fits of the audited model on altered training sets (the audit's ground truth for influence).

Two kinds (the report says which one it used):

- **warm start** (default): the saved weights are the starting point; every trainable parameter of the
  TorchScript module, exported program or suite network (for a converted TorchScript module, the FX
  graph's copy of them) is trained again with Adam for `epochs` epochs at learning rate `lr`, batch
  `batch_size`, on the model's own loss (cross-entropy; MSE on +-1 for one output), with a seeded batch
  order. Batch norm and dropout keep their evaluation behaviour (the file is an evaluation graph).
  After each re-fit the saved weights are put back, so every re-fit starts from the same point and the
  rest of the audit sees the model as loaded.
- **train function** (`--train-fn module:function`): the user's own training recipe, fitted from scratch.
  `function(x, y, seed)` receives the training inputs in the model's input shape `(n, *input_shape)`
  (float32 in [0, 1]) and labels `(n,)` (int64) and returns a trained `torch.nn.Module` mapping such
  inputs to logits `(n, classes)`. Importing the module runs its code: it is the user's own code, named
  explicitly on the command line, and is never imported otherwise.

The effect of altering the training set is always measured against a **control**: the same kind of
re-fit, with the same seed, on the unaltered set; so what the optimiser does anyway cancels out.

Adequacy of the re-fits (the panels that use them are "not measurable" without it): a warm-start
control must keep the saved model's fit (train and test accuracy each at most `REFIT_TOLERANCE`
below the saved model's, and test accuracy at most `REFIT_TOLERANCE` above it: a warm start that
teaches an untrained model the task re-fits a different model than the one saved); a from-scratch
control must pass the accuracy part of the adequacy gate of `empirics.protocols` (train accuracy at
least halfway from chance to 1, test accuracy a tenth of the way).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import math
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from empirics.audit_ntk import trainable
from empirics.common import Tensors
from empirics.losses import loss_fn, predict_labels
from empirics.protocols import GATE_TEST, GATE_TRAIN, chance_accuracy
from ntkm.errors import UserInputError

WARM, TRAIN_FN = "warm start", "train function"
#: How far (in accuracy) a warm-start control re-fit may fall below the saved model and still count.
REFIT_TOLERANCE = 0.05


@dataclass(frozen=True)
class RefitConfig:
    """How the audit fits the model again: warm start (epochs, lr, batch) or the user's `train_fn`."""

    epochs: int = 5
    lr: float = 1e-3
    batch_size: int = 64
    train_fn: str | None = None

    def __post_init__(self) -> None:
        if self.epochs < 1 or not (math.isfinite(self.lr) and self.lr > 0) or self.batch_size < 1:
            raise UserInputError("--refit-epochs and --refit-batch must be >= 1 and --refit-lr a finite number > 0")
        if self.train_fn is not None and (self.train_fn.count(":") != 1 or not all(self.train_fn.split(":"))):
            raise UserInputError(f"--train-fn must be MODULE:FUNCTION (e.g. mytrain:fit or path/to/file.py:fit), "
                                 f"got '{self.train_fn}'")

    @property
    def kind(self) -> str:
        return TRAIN_FN if self.train_fn else WARM

    def describe(self) -> str:
        if self.train_fn:
            return f"the user's train function {self.train_fn}, from scratch, seeded"
        return (f"warm start from the saved weights: Adam, lr {self.lr:g}, {self.epochs} epochs, batch "
                f"{self.batch_size}, seeded batch order")


def load_train_fn(spec: str) -> Callable[..., nn.Module]:
    """Import `module:function` (a module name, or a path to a .py file). This runs the user's own code."""
    mod_name, fn_name = spec.split(":")
    try:
        if mod_name.endswith(".py"):
            path = Path(mod_name).expanduser().absolute()
            if not path.is_file():
                raise UserInputError(f"--train-fn {spec}: file {path} does not exist")
            loader_spec = importlib.util.spec_from_file_location(path.stem, path)
            if loader_spec is None or loader_spec.loader is None:
                raise UserInputError(f"--train-fn {spec}: {path} cannot be imported")
            module = importlib.util.module_from_spec(loader_spec)
            loader_spec.loader.exec_module(module)
        else:
            module = _import_named(mod_name)
    except UserInputError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure of the user's module is reported in one line
        hint = ("; only the named module is taken from the working directory (it is not put on the import path): "
                "import its helpers relative to a package, or install them") if isinstance(exc, ImportError) else ""
        raise UserInputError(f"--train-fn {spec}: importing {mod_name} failed "
                             f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}){hint}") from None
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise UserInputError(f"--train-fn {spec}: {mod_name} has no function {fn_name}")
    return fn


def _import_named(name: str) -> Any:
    """Import module `name` from the working directory (only that name's top-level module or package is looked
    up there), else from the installed packages. The working directory never goes on `sys.path`, so no other
    import (a `weasyprint.py` lying there, say) can be taken from it."""
    top = name.split(".")[0]
    if top not in sys.modules:
        spec = importlib.machinery.PathFinder.find_spec(top, [str(Path.cwd())])
        if spec is not None and spec.loader is not None:
            module = importlib.util.module_from_spec(spec)
            sys.modules[top] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                sys.modules.pop(top, None)
                raise
    return importlib.import_module(name)


class Refitter:
    """Fits the model again on altered training sets; `outputs` returns the re-fitted model's outputs.

    `net` maps flat inputs (n, d) to logits (warm start trains `params`, which `net` uses, in place and
    restores them afterwards); `input_shape` is the per-example shape a train function receives.
    """

    def __init__(self, net: nn.Module, params: list[torch.Tensor], cfg: RefitConfig, out_dim: int,
                 input_shape: tuple[int, ...]):
        self.net = net
        self.params = params
        self.cfg = cfg
        self.out_dim = out_dim
        self.input_shape = tuple(input_shape)
        self.count = 0
        self.seconds = 0.0
        self._fn = load_train_fn(cfg.train_fn) if cfg.train_fn else None
        self._controls: dict[int, dict[str, np.ndarray]] = {}

    @classmethod
    def for_module(cls, module: nn.Module, net: nn.Module, cfg: RefitConfig, out_dim: int,
                   input_shape: tuple[int, ...]) -> Refitter:
        """A re-fitter that trains every trainable tensor of `module` (which `net` calls)."""
        params = list(trainable(module).values())
        if not params and cfg.train_fn is None:
            raise UserInputError("the model has no trainable parameters, so it cannot be re-fitted; pass "
                                 "--train-fn MODULE:FUNCTION with your own training recipe")
        return cls(net, params, cfg, out_dim, input_shape)

    def _warm(self, x: torch.Tensor, y: torch.Tensor, seed: int) -> None:
        per_ex = loss_fn(self.out_dim)
        opt = torch.optim.Adam(self.params, lr=self.cfg.lr)
        gen = torch.Generator().manual_seed(seed)
        n, b = len(x), self.cfg.batch_size
        with torch.enable_grad():
            for _ in range(self.cfg.epochs):
                perm = torch.randperm(n, generator=gen).to(x.device)  # seeded on the CPU, moved
                for i in range(0, n, b):
                    idx = perm[i:i + b]
                    opt.zero_grad(set_to_none=True)
                    per_ex(self.net(x[idx]), y[idx]).mean().backward()
                    opt.step()

    @contextmanager
    def fitted(self, x: torch.Tensor, y: torch.Tensor, seed: int) -> Iterator[nn.Module]:
        """The model fitted again on (x, y) with `seed`, as a module on flat inputs; restored on exit."""
        tic = time.perf_counter()
        self.count += 1
        if self._fn is not None:
            torch.manual_seed(seed)
            try:
                model = self._fn(x.reshape(len(x), *self.input_shape).clone(), y.clone(), seed)
            except UserInputError:
                raise
            except Exception as exc:  # noqa: BLE001 - the user's function failing is reported in one line
                raise UserInputError(f"--train-fn {self.cfg.train_fn} failed ({type(exc).__name__}: "
                                     f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
            if not isinstance(model, nn.Module):
                raise UserInputError(f"--train-fn {self.cfg.train_fn} returned {type(model).__name__}; it must "
                                     "return the trained torch.nn.Module")
            model.eval()
            fitted = self._checked_outputs(model, x[:2])
            self.seconds += time.perf_counter() - tic
            yield fitted
            return
        saved = [p.detach().clone() for p in self.params]
        try:
            self._warm(x, y, seed)
            self.seconds += time.perf_counter() - tic
            yield self.net
        finally:
            with torch.no_grad():
                for p, s in zip(self.params, saved, strict=True):
                    p.copy_(s)

    def _checked_outputs(self, model: nn.Module, x: torch.Tensor) -> nn.Module:
        """The train function's model on flat inputs, refused unless it gives `out_dim` logits per example."""
        from verify.modelio import FlatInput

        net = FlatInput(model, self.input_shape)
        try:
            with torch.no_grad():
                out = net(x)
        except UserInputError as exc:
            raise UserInputError(f"--train-fn {self.cfg.train_fn} returned a model that does not fit the audit: "
                                 f"{exc}") from None
        except Exception as exc:  # noqa: BLE001 - the user's model failing is reported in one line
            why = str(exc).splitlines()[0] if str(exc) else ""
            raise UserInputError(f"--train-fn {self.cfg.train_fn} returned a model that fails on the training "
                                 f"inputs ({type(exc).__name__}: {why})") from None
        if tuple(out.shape) != (len(x), self.out_dim):
            raise UserInputError(f"--train-fn {self.cfg.train_fn} returned a model with outputs of shape "
                                 f"{tuple(out.shape)} for {len(x)} examples; the audited model gives ({len(x)}, "
                                 f"{self.out_dim}): return a model with the same {self.out_dim} outputs")
        return net

    def outputs(self, x: torch.Tensor, y: torch.Tensor, seed: int,
                evals: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
        """Fit again on (x, y) with `seed`; return the re-fitted model's outputs on each named input set."""
        with self.fitted(x, y, seed) as net, torch.no_grad():
            return {k: net(v).detach().double().numpy() for k, v in evals.items()}

    def control(self, x: torch.Tensor, y: torch.Tensor, seed: int,
                evals: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
        """The re-fit on the unaltered training set with `seed` (computed once per seed)."""
        if seed not in self._controls:
            self._controls[seed] = self.outputs(x, y, seed, evals)
        return self._controls[seed]


@dataclass(frozen=True)
class RefitInputs:
    """What a panel that re-fits the model and attacks its training points works on: the re-fitter, the saved model
    on flat inputs (the attacks' target) and the audit's data (`t.out_dim`: the model's outputs)."""

    refit: Refitter
    model: nn.Module
    t: Tensors


def per_example_loss(out: np.ndarray, y: np.ndarray, out_dim: int) -> np.ndarray:
    """The model's own loss of each example (cross-entropy, or MSE on +-1 for one output)."""
    with torch.no_grad():
        return loss_fn(out_dim)(torch.as_tensor(out), torch.as_tensor(y)).double().numpy()


def labels_of(out: np.ndarray) -> np.ndarray:
    return predict_labels(torch.as_tensor(out)).numpy()


def refit_adequacy(kind: str, control: dict[str, np.ndarray], t: Tensors,
                   saved_acc: tuple[float, float]) -> dict[str, Any]:
    """Did the control re-fit (its outputs on `t`'s training and test points) keep (warm start) or reach (train
    function) a fit? (the module docstring's rule; `saved_acc`: the saved model's train and test accuracy)"""
    saved_train_acc, saved_test_acc = saved_acc
    out_dim = t.out_dim
    tr = float(np.mean(labels_of(control["train"]) == t.y_train.numpy()))
    te = float(np.mean(labels_of(control["test"]) == t.y_test.numpy()))
    if kind == WARM:
        need_tr, need_te = saved_train_acc - REFIT_TOLERANCE, saved_test_acc - REFIT_TOLERANCE
        most_te = saved_test_acc + REFIT_TOLERANCE
        rule = (f"a warm-start control re-fit keeps the saved model's fit: train and test accuracy at most "
                f"{REFIT_TOLERANCE:g} below the saved model's ({saved_train_acc:.3f}, {saved_test_acc:.3f}), test "
                f"accuracy at most {REFIT_TOLERANCE:g} above it")
    else:
        chance = chance_accuracy(out_dim, max(out_dim, 2))
        need_tr, need_te = chance + GATE_TRAIN * (1 - chance), chance + GATE_TEST * (1 - chance)
        most_te = math.inf
        rule = (f"a from-scratch control re-fit passes the accuracy gate: train accuracy >= {need_tr:.2f}, test "
                f"accuracy >= {need_te:.2f}")
    why = []
    if tr < need_tr:
        why.append(f"control re-fit train accuracy {tr:.3f} < {need_tr:.3f}")
    if te < need_te:
        why.append(f"control re-fit test accuracy {te:.3f} < {need_te:.3f}")
    if te > most_te:
        why.append(f"control re-fit test accuracy {te:.3f} > {most_te:.3f}: the warm start improves the saved model "
                   f"({saved_test_acc:.3f}), so it fits a different model than the one saved")
    return {"passed": not why, "reason": "; ".join(why) or "passed", "train_acc": tr, "test_acc": te, "rule": rule}
