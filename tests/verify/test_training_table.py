"""The report's training table: every trained network of a unit, the gd-mse networks of an NTK-distance sweep as rows
of their own, the kernel predictors' test accuracy (analytic and initial NTK of the distance sweeps, analytic and
trained NTK of the malleability and landscape networks) and the robust accuracy the adversarial gate reads."""

from __future__ import annotations

from reports.claims_report import training_table


def _gate(passed: bool, robust: float | None = None) -> dict:
    return {"passed": passed, "reason": "passed" if passed else "no plateau after 9 epochs",
            **({"robust_train_acc": robust} if robust is not None else {})}


def _run(seed: int, acc: float) -> dict:
    return {"model": "relu", "seed": seed, "width": 16, "train_acc": 0.9, "test_acc": 0.8, "train_loss": 0.1,
            "epochs_run": 100, "plateau_reached": True, "gate": _gate(True), "ntk_predictor_test_acc": acc,
            "empirical_ntk_predictor_test_acc": acc - 0.1, "gd_train_acc": 0.7, "gd_test_acc": 0.6,
            "gd_train_loss": 0.2, "gd_epochs_run": 300, "gd_plateau_reached": False, "gd_gate": _gate(False)}


def test_training_rows_carry_kernel_accuracy_gd_mse_and_robust_accuracy():
    mall = {"runs": [{"model": "attn", "training": t, "seed": 0, "train_acc": 0.9, "test_acc": 0.5, "train_loss": 0.3,
                      "epochs_run": 60, "plateau_reached": True, "gate": _gate(True, 0.4 if t != "standard" else None),
                      "ntk_predictor_test_acc": 0.45,
                      "trained_ntk_predictor_test_acc": 0.55 if t == "standard" else 0.35}
                     for t in ("standard", "adversarial")]}
    record = {"results": {"ntk-distance:mnist@proper": {"models": {"relu": {"runs": [_run(0, 0.5), _run(1, 0.7)]}}},
                          "malleability-adv:mnist@proper": mall}}
    rows = {(r["unit"], r["model"]): r for r in training_table(record)}
    main = rows[("ntk-distance:mnist", "relu")]
    assert main["kernel_acc"] == "0.60 [0.50–0.70] / 0.50 [0.40–0.60]" and main["passed"] == 2
    gd = rows[("ntk-distance:mnist", "relu (gd-mse)")]
    assert gd["passed"] == 0 and gd["epochs"] == "300 [300–300]" and gd["plateau"] == "0/2"
    assert gd["kernel_acc"] == main["kernel_acc"]
    assert rows[("malleability-adv:mnist", "attn (adversarial)")]["robust_acc"] == "0.40"
    assert rows[("malleability-adv:mnist", "attn")]["robust_acc"] == "-"
    # malleability and landscape runs: the analytic predictor and the trained network's kernel, no kernel at init
    assert rows[("malleability-adv:mnist", "attn")]["kernel_acc"] == "0.45 / -"
    assert rows[("malleability-adv:mnist", "attn")]["trained_kernel_acc"] == "0.55"
    assert rows[("malleability-adv:mnist", "attn (adversarial)")]["trained_kernel_acc"] == "0.35"
    assert main["trained_kernel_acc"] == gd["trained_kernel_acc"] == "-"
