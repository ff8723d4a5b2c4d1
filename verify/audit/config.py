"""Settings of `verify audit` (`AuditConfig`, whose fields generate the command's options) and the named
constants of its record: the attacks and panels it can run, the record's schema version, the summary's marker
and the definitions printed in the report.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from empirics.attribution.audit_attribution import PEERS
from empirics.attribution.influence import RIDGE_REL_DEFAULT
from empirics.kernels.audit_ntk import PROJECTION_KINDS
from ntkm.errors import UserInputError
from verify.audit.budget import REALISTIC_EPS
from verify.audit.modelio import parse_shape
from verify.audit.projection import AUTO_DIM
from verify.audit.refit import STACK_MODES, WORKERS_MAX, RefitConfig
from verify.audit.seeding import SEEDINGS

AUDIT_ATTACKS = ("fgsm", "pgd", "mim")
PANELS = ("budget", "poison", "validity", "outcome")
#: `--device` values (auto: cuda when visible).
DEVICES = ("auto", "cpu", "cuda")
#: Version of the audit record's structure (`verify/schemas/audit.schema.json`); raised on a breaking change.
SCHEMA_VERSION = 1
#: First line of the Markdown summary (`--summary`): marks the file as an audit output (and a CI comment to update).
SUMMARY_MARKER = "<!-- verify audit summary -->"


@dataclass(frozen=True)
class AuditConfig:
    """Settings of one audit (the CLI's options; every one is printed in the report's appendix). A field's
    metadata is its `verify audit` option: help text, and the flag where it is not `--field-name`."""

    model: str = field(metadata={
        "help": "TorchScript file, torch.export .pt2, or weights (safetensors / torch.save state dict) with a spec "
                "JSON"})
    train: str = field(metadata={
        "help": ".npz with arrays x, y; an MNIST IDX or CIFAR-10 folder; an image folder ROOT/train/<class>/*; or "
                "mnist / cifar10"})
    test: str | None = field(default=None, metadata={
        "help": "test data in the same forms (default: the test split of --train)"})
    spec: str | None = field(default=None, metadata={
        "help": "architecture spec JSON for weights (default: MODEL.json)"})
    input_shape: str | None = field(default=None, metadata={
        "help": "per-example input shape, e.g. 1,28,28 (default: inferred)"})
    eps: float = field(default=REALISTIC_EPS, metadata={
        "help": "perturbation budget per pixel, inputs in [0, 1] (default: 8/255, a budget that leaves an image "
                "looking like the original)"})
    tau: float = field(default=0.1, metadata={
        "help": "fraction of training points perturbed, the top by |influence| (default: %(default)s)"})
    attacks: tuple[str, ...] = field(default=AUDIT_ATTACKS, metadata={"flag": "--attack",
        "help": "comma-separated: fgsm, pgd, mim (default: %(default)s)"})
    n: int = field(default=1000, metadata={"help": "training points audited, a seeded subset (default: %(default)s)"})
    n_test: int = field(default=200, metadata={"help": "test points (default: %(default)s)"})
    steps: int = field(default=10, metadata={"help": "PGD / MIM steps (default: %(default)s)"})
    baseline_seeds: int = field(default=3, metadata={"help": "random-noise repetitions (default: %(default)s)"})
    reference: bool = field(default=True, metadata={"flag": "--no-reference",
        "help": "skip training the 2L-ReLU / MLP-Attn references (the paper-reported scale is used)"})
    ref_width: int = field(default=512, metadata={"help": "width of the reference networks (default: %(default)s)"})
    ref_epochs: int = field(default=1000, metadata={
        "help": "maximum training epochs of the references, trained to a plateau with the width-consistent protocol "
                "(default: %(default)s)"})
    top_k: int = field(default=12, metadata={"help": "lever examples shown (default: %(default)s)"})
    seed: int = field(default=0, metadata={"help": "seed of subsets, attacks and references (default: %(default)s)"})
    hessian_iters: int = field(default=20, metadata={
        "help": "power iterations for the top Hessian eigenvalue (default: %(default)s)"})
    hessian_points: int | None = field(default=None, metadata={
        "help": "training points the sharpness is measured on (default: all while points x parameters <= 1.2e9, else a "
                "seeded subsample of 1.2e9 / parameters, at least 32)"})
    bound_eps: float = field(default=0.1, metadata={
        "help": "NTK accuracy eps in the v1 / ReLU width bounds (default: %(default)s)"})
    ridge_rel: float = RIDGE_REL_DEFAULT
    max_memory_gb: float = field(default=2.0, metadata={
        "help": "memory budget in GiB for Jacobians, the sharpness's Hessian products and stacked re-fits (default: "
                "%(default)s)"})
    data_dir: str | None = field(default=None, metadata={
        "help": "where the built-in data sets are found (default: automatic)"})
    panels: tuple[str, ...] = field(default=PANELS, metadata={"flag": "--skip",
        "help": "panels to leave out, comma-separated: budget, poison, validity, outcome (default: none)"})
    refit_epochs: int = field(default=5, metadata={"help": "epochs of each warm-start re-fit (default: %(default)s)"})
    refit_lr: float = field(default=1e-3, metadata={
        "help": "Adam learning rate of the warm-start re-fits (default: %(default)s)"})
    refit_batch: int = field(default=64, metadata={
        "help": "batch size of the warm-start re-fits (default: %(default)s)"})
    train_fn: str | None = field(default=None, metadata={"metavar": "MODULE:FUNCTION",
        "help": "re-fit from scratch with your own training recipe: FUNCTION(x, y, seed) -> trained nn.Module; MODULE "
                "is a module name or a .py path. This imports and runs YOUR code (default: warm start from the "
                "saved weights)"})
    lds_subsets: int = field(default=24, metadata={
        "help": "random subsets (re-fits) of the linear datamodeling score (default: %(default)s)"})
    lds_repeats: int = field(default=2, metadata={
        "help": "re-fits of each LDS subset with different seeds: their agreement sets the noise ceiling, their mean "
                "is the target (default: %(default)s)"})
    ensemble: int = field(default=3, metadata={"metavar": "K",
        "help": "ensemble estimators: every estimator of the audit averaged over K full-data re-fits with seeds seed, "
                "seed + 1, ... (each with its own exact empirical NTK), scored by the validity panel beside the "
                "others and leading the flip rates where one predicts the re-fits best; 0 turns them off; not run "
                "where the kernel is projected or with --lds-seeds paired (default: %(default)s)"})
    lds_seeds: str = field(default="fresh", metadata={"choices": tuple(SEEDINGS),
        "help": "seeds of the LDS re-fits: fresh (a new seed for every re-fit of every subset, so that subsets share "
                "no batch order and the repeats' agreement is the noise ceiling's honest input) or paired (every "
                "subset re-fitted with the same seeds seed, seed + 1, ..., each against the control of its seed: the "
                "design before issue 43 item 4, which shares each seed's noise across subsets and inflates the "
                "repeats' agreement) (default: %(default)s)"})
    lds_max_subsets: int | None = field(default=None, metadata={"metavar": "M",
        "help": "the adaptive validity panel's budget: after the --lds-subsets pilot it adds as many subsets again "
                "(each re-fitted --lds-repeats times) while the lead estimator's fraction-of-ceiling interval "
                "straddles the bar, up to M subsets; equal to --lds-subsets: no adaptation (default: twice "
                "--lds-subsets)"})
    lds_fraction: float = field(default=0.1, metadata={
        "help": "fraction of training points each LDS subset leaves out (default: %(default)s)"})
    peers: tuple[str, ...] = field(default=PEERS, metadata={
        "help": "the field's attribution libraries scored in the validity panel beside the audit's estimators, "
                "comma-separated: ekfac, kfac, identity (kronfluence), trak (traker), or none; each one not installed "
                "says how to install it (default: %(default)s)"})
    refit_seeds: int = field(default=3, metadata={
        "help": "re-fit seeds of the outcome table, of each point of the re-fitted budget curves, and of the re-fit "
                "noise (default: %(default)s)"})
    outcome_targets: int = field(default=20, metadata={
        "help": "targeted test predictions in the outcome table (default: %(default)s)"})
    target_test: int | None = field(default=None, metadata={
        "help": "test point of the brittleness check (default: a correctly predicted one of median margin)"})
    poison_fraction: float = field(default=0.05, metadata={
        "help": "fraction of training points planted as poison in the self-test (default: %(default)s)"})
    curve_attack: str = field(default="pgd", metadata={"help": "attack of the budget curves (default: %(default)s)"})
    projection_dim: int | None = field(default=None, metadata={"metavar": "K",
        "help": "project per-example gradients to K dimensions (0: the exact kernel; default: exact "
                f"while all Jacobians fit --max-memory-gb, else {AUTO_DIM})"})
    projection_kind: str = field(default="gaussian", metadata={"flag": "--projection", "choices": PROJECTION_KINDS,
        "help": "entries of the random projection (default: %(default)s)"})
    device: str = field(default="auto", metadata={"choices": DEVICES,
        "help": "where your model, its Jacobians and projections, the re-fits, sharpness, attacks and references run: "
                "cuda, cpu, or auto (cuda when visible) (default: %(default)s)"})
    refit_stack: str = field(default="auto", metadata={"choices": STACK_MODES,
        "help": "run re-fits of equal training-set size as one stacked computation (torch.func vmap over copies of "
                "the parameters) where the model allows it: auto (on CUDA; on the CPU, where it measured slower, "
                "one at a time), on, off (default: %(default)s)"})
    refit_workers: int | None = field(default=None, metadata={"metavar": "N",
        "help": f"worker processes of one torch thread each for the re-fits on the CPU that are not stacked (1: in "
                f"this process; default: one per core this process may use, at most {WORKERS_MAX})"})

    @property
    def subset_budget(self) -> int:
        """The most LDS subsets the adaptive validity panel may re-fit (`lds_max_subsets`, else twice the pilot)."""
        return self.lds_max_subsets if self.lds_max_subsets is not None else 2 * self.lds_subsets

    def refit_config(self) -> RefitConfig:
        return RefitConfig(self.refit_epochs, self.refit_lr, self.refit_batch, self.train_fn, self.refit_stack,
                           int(self.max_memory_gb * 2**30), self.refit_workers)

    def __post_init__(self) -> None:
        if not self.attacks:
            raise UserInputError("--attack needs at least one of fgsm, pgd, mim")
        for a in self.attacks:
            if a not in AUDIT_ATTACKS:
                raise UserInputError(f"unknown attack '{a}'; choose from {', '.join(AUDIT_ATTACKS)} (random noise "
                                     "is always run as the baseline)")
        checks = [
            (0.0 < self.eps <= 1.0, f"--eps must be in (0, 1] (pixel units), got {self.eps}"),
            (0.0 < self.tau <= 1.0, f"--tau must be in (0, 1] (a fraction of the training set), got {self.tau}"),
            (self.n >= 2, f"--n must be >= 2, got {self.n}"),
            (self.n_test >= 1, f"--n-test must be >= 1, got {self.n_test}"),
            (self.steps >= 1, f"--steps must be >= 1, got {self.steps}"),
            (self.baseline_seeds >= 2,
             f"--baseline-seeds must be >= 2 (a spread needs two), got {self.baseline_seeds}"),
            (self.ref_width >= 1 and self.ref_epochs >= 0, "--ref-width must be >= 1 and --ref-epochs >= 0"),
            (self.top_k >= 1, f"--top-k must be >= 1, got {self.top_k}"),
            (self.hessian_iters >= 1, f"--hessian-iters must be >= 1, got {self.hessian_iters}"),
            (self.hessian_points is None or self.hessian_points >= 2,
             f"--hessian-points must be >= 2, got {self.hessian_points}"),
            (self.bound_eps > 0, f"--bound-eps must be > 0, got {self.bound_eps}"),
            (self.max_memory_gb > 0, f"--max-memory-gb must be > 0, got {self.max_memory_gb}"),
            (set(self.panels) <= set(PANELS), f"--skip takes panels from {', '.join(PANELS)}"),
            (self.lds_subsets >= 3, f"--lds-subsets must be >= 3, got {self.lds_subsets}"),
            (self.ensemble == 0 or self.ensemble >= 2,
             f"--ensemble must be 0 (off) or at least 2 (an average of one re-fit is that re-fit), got "
             f"{self.ensemble}"),
            (self.lds_repeats >= 2,
             f"--lds-repeats must be >= 2 (the noise ceiling needs two re-fits to compare), got {self.lds_repeats}"),
            (0.0 < self.lds_fraction < 1.0, f"--lds-fraction must be in (0, 1), got {self.lds_fraction}"),
            (self.lds_max_subsets is None or self.lds_max_subsets >= self.lds_subsets,
             f"--lds-max-subsets must be >= --lds-subsets ({self.lds_subsets}), got {self.lds_max_subsets}"),
            (self.refit_seeds >= 2, f"--refit-seeds must be >= 2 (an interval needs two), got {self.refit_seeds}"),
            (self.outcome_targets >= 1, f"--outcome-targets must be >= 1, got {self.outcome_targets}"),
            (self.target_test is None or 0 <= self.target_test < self.n_test,
             f"--target-test must be an index into the {self.n_test} test points, got {self.target_test}"),
            (0.0 < self.poison_fraction <= 0.5, f"--poison-fraction must be in (0, 0.5], got {self.poison_fraction}"),
            (set(self.peers) <= set(PEERS), f"--peers takes names from {', '.join(PEERS)}, or none"),
            (self.curve_attack in AUDIT_ATTACKS, f"--curve-attack must be one of {', '.join(AUDIT_ATTACKS)}"),
            (self.projection_dim is None or self.projection_dim >= 0,
             f"--projection-dim must be >= 0 (0: the exact kernel), got {self.projection_dim}"),
            (self.projection_kind in PROJECTION_KINDS, f"--projection must be one of {', '.join(PROJECTION_KINDS)}"),
            (self.device in DEVICES, f"--device must be one of {', '.join(DEVICES)}, got {self.device}"),
        ]
        for ok, msg in checks:
            if not ok:
                raise UserInputError(msg)
        parse_shape(self.input_shape)
        self.refit_config()


#: The terms the report explains, stored in every record (`definitions`).
DEFINITIONS = {
    "influence": "NTK leave-one-out influence of a training point on the test loss: the change of the summed "
                 "squared test error of kernel ridge regression with the model's empirical NTK when the point is "
                 "removed (exact, no retraining). Positive: the point helps; negative: it hurts.",
    "gn_influence": "Gauss-Newton influence: (1/n) g_test^T H^-1 g_i with H = J^T J / n + lambda I, computed "
                    "through the same kernel by Woodbury; uses the network's own loss gradients.",
    "ef_influence": "Empirical-Fisher influence: (1/n) g_test^T F^-1 g_i with F = G^T G / n + lambda I the "
                    "empirical Fisher of the per-example loss gradients G, solved exactly in the n-dimensional dual "
                    "(Woodbury, through the gradients' Gram matrix; ridge 0.1 x its mean diagonal); scored in the "
                    "validity panel beside NTK and Gauss-Newton influence.",
    "flip_rate": "Of the top tau training points by |influence|, the fraction whose influence changes sign "
                 "(helpful <-> harmful) after each is perturbed within +-eps per pixel and the kernel recomputed.",
    "rho": "Spearman rank correlation of all training points' influences before and after the perturbation: "
           "1 means the ranking of what the model relies on is unchanged; lower is more malleable.",
    "baseline": "The same protocol with random signs times eps instead of an attack: what any perturbation of "
                "that size does. An attack flip rate inside this band is not evidence of malleability.",
    "kappa_data": "Condition number of the training Gram matrix G = X X^T (infinite when n > d: G is singular).",
    "kappa_ntk": "Condition number of the model's empirical NTK on the training subset: large values mean the "
                 "kernel predictor, and so influence, is sensitive to small changes of the data.",
    "width_bounds": "Thm 4.7: MLP-Attn needs width m = kappa^6 / eps^2 (v1) or kappa_d^6 n ln n (v2) to behave "
                    "like its NTK; 2L-ReLU needs 1 / eps^2. Constants are set to 1.",
    "sharpness": "Largest eigenvalue of the Hessian of the mean training loss (power iteration); "
                 "sharpness_w2 = lambda_max ||theta||^2 is comparable across parameterisations.",
    "re_fit": "Fitting the model again on an altered training set (warm start from the saved weights, or your "
              "--train-fn from scratch), compared with a control re-fit of the unaltered set with the same seed.",
    "lds": "Linear datamodeling score: Spearman correlation, over random subsets of the training set, between the "
           "predicted change of a test point's loss (sum of the left-out points' influences) and the actual change "
           "after re-fitting (the mean of --lds-repeats re-fits), averaged over test points.",
    "noise_ceiling": "The highest LDS a perfect predictor could reach given the re-fits' own noise: from how well "
                     "repeated re-fits of the same subsets agree (r1) and the number of repeats k, "
                     "sqrt(k r1 / (1 + (k - 1) r1)). An estimator's LDS is also reported as a fraction of it.",
    "breaking_budget": "The smallest eps at which the attack's flip rate exceeds the random-noise ceiling of the same "
                       "eps, significantly (Fisher exact test).",
    "self_influence": "A training point's squared leave-one-out error under kernel ridge regression with the NTK: "
                      "large for points the rest of the data contradict, such as flipped labels.",
}
