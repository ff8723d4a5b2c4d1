"""The engine's padded stacking (`train_many(..., pad=True)`, the default on CUDA): networks of different widths, and
leave-one-out networks with one point fewer, trained as one stack equal the per-network loop `train` to float32
rounding, with the same epochs, plateau flags and records; padded hidden units stay exactly zero; the CPU default
(exact grouping) stays bit-equal to the loop."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch
from tolerances import F32_ACCUMULATED, F32_REORDER

from empirics.nets import engine
from empirics.nets.engine import stack_plan, train_many
from empirics.nets.models import ModelSpec, TwoLayerNet
from empirics.nets.train import TrainConfig, train_job

N, D, N_TEST, C = 100, 24, 30, 10
WIDTHS = (8, 16, 64)


@pytest.fixture(autouse=True)
def _torch_threads():
    """One thread (the suite's default): these are small products, and a second thread on a shared machine is slow."""
    torch.set_num_threads(1)


def _data(out_dim: int = C):
    """Random inputs in [0, 1]^D with random labels (a task the networks fit slowly, so plateaus come at various
    epochs)."""
    g = torch.Generator().manual_seed(11)
    x, xt = torch.rand(N, D, generator=g), torch.rand(N_TEST, D, generator=g)
    classes = max(out_dim, 2)
    return x, torch.randint(0, classes, (N,), generator=g), xt, torch.randint(0, classes, (N_TEST,), generator=g)


def _cfg(optimizer: str = "adam", **kw) -> TrainConfig:
    """Adam with a rate per width (`lr_ref_width`), or full-batch GD; short windows so plateaus are reached."""
    base = dict(epochs=16, batch_size=32, check_every=2, plateau_window=6, plateau_tol=0.05)
    if optimizer == "adam":
        base.update(lr=1e-2, lr_ref_width=16)
    else:
        base.update(optimizer="gd", lr=0.5)
    return TrainConfig(**{**base, **kw})


def _width_jobs(cfg: TrainConfig, out_dim: int = C, widths=WIDTHS, seeds=(0, 1)):
    """Both models at every width, each seed its own initialisation and batch order."""
    x, y, xt, yt = _data(out_dim)
    return [(TwoLayerNet(ModelSpec(kind, D, m, out_dim, seed=s), x), x, y, replace(cfg, seed=s), xt, yt, f"{kind} {m}")
            for s in seeds for kind in ("relu", "attn") for m in widths]


def _loo_jobs(cfg: TrainConfig, removed=(None, 0, 37, N - 1), widths=(16, 64)):
    """Leave-one-out refits as the influence check builds them: the full network and one network per removed point
    (MLP-Attn: its own context from its own points; the input statistics of the full set)."""
    x, y, xt, yt = _data()
    jobs = []
    for kind in ("relu", "attn"):
        for m in widths:
            for r in removed:
                keep = torch.tensor([i for i in range(N) if i != r])
                model = TwoLayerNet(ModelSpec(kind, D, m, C, seed=1), x[keep], reference=x)
                jobs.append((model, x[keep], y[keep], cfg, xt, yt, f"{kind} {m} without {r}"))
    return jobs


def _copy(jobs):
    return [(copy.deepcopy(j[0]), *j[1:]) for j in jobs]


def _tied_outputs(model: TwoLayerNet) -> bool:
    """Whether two columns of A are equal: those two outputs are then equal on every input, an exact tie the loop
    breaks towards the first class and a float32 rounding of the stack's products (at another width of the sum)
    either way (at width 8 about one network in six has such a pair)."""
    a = model.A
    return any(torch.equal(a[:, i], a[:, k]) for i in range(a.shape[1]) for k in range(i + 1, a.shape[1]))


def _assert_close(loop_jobs, loop_recs, jobs, recs):
    """Equal to float32 rounding: weights (relative F32_REORDER on entries of size ~1), losses; the same epochs,
    plateau flags and learning rates; accuracies equal or one example apart (a near-tie of two outputs), unless the
    network has exactly tied outputs (`_tied_outputs`)."""
    for ja, a, jb, b in zip(loop_jobs, loop_recs, jobs, recs, strict=True):
        n, n_test = ja[1].shape[0], ja[4].shape[0]
        assert jb[0].W.shape == ja[0].W.shape
        assert torch.allclose(jb[0].W, ja[0].W, rtol=F32_REORDER, atol=F32_REORDER), ja[-1]
        assert (b.epochs_run, b.plateau_reached, b.epochs, b.lr) == (a.epochs_run, a.plateau_reached, a.epochs, a.lr)
        assert b.train_loss == pytest.approx(a.train_loss, rel=F32_ACCUMULATED)
        assert b.final_train_loss == pytest.approx(a.final_train_loss, rel=F32_ACCUMULATED)
        assert b.rel_weight_change == pytest.approx(a.rel_weight_change, rel=F32_ACCUMULATED)
        if _tied_outputs(ja[0]):
            continue
        assert b.train_acc == pytest.approx(a.train_acc, abs=1.01 / n)
        assert b.test_acc == pytest.approx(a.test_acc, abs=1.01 / n_test)
        assert b.final_train_acc == pytest.approx(a.final_train_acc, abs=1.01 / n)
        assert b.final_test_acc == pytest.approx(a.final_test_acc, abs=1.01 / n_test)


def _loop_and_stack(jobs, **kw):
    loop_jobs, ours = _copy(jobs), _copy(jobs)
    loop = [train_job(j) for j in loop_jobs]
    got = train_many(ours, pad=True, **kw)
    _assert_close(loop_jobs, loop, ours, got)
    return loop, ours


@pytest.mark.parametrize("plateau", [False, True])
@pytest.mark.parametrize("loss", ["auto", "mse"])
@pytest.mark.parametrize("decay", ["coupled", "decoupled"])
@pytest.mark.parametrize("optimizer", ["adam", "gd"])
def test_widths_in_one_padded_stack_equal_the_loop(optimizer, decay, loss, plateau):
    """Networks of widths 8, 16 and 64 (both models, two seeds) form one stack and equal `train` one by one; Adam
    with its own rate per width, GD under mse with its own rate per network (`lr_from_ntk`)."""
    cfg = _cfg(optimizer, decay=decay, loss=loss, plateau=plateau, lr_from_ntk=optimizer == "gd" and loss == "mse")
    jobs = _width_jobs(cfg)
    assert stack_plan(jobs, pad=True) == [[2, 5, 8, 11, 1, 4, 7, 10, 0, 3, 6, 9]]  # widest first
    assert len(stack_plan(jobs, pad=False)) == len(WIDTHS)
    loop, _ = _loop_and_stack(jobs)
    if optimizer == "adam":
        assert len({r.lr for r in loop}) == len(WIDTHS)
    if plateau:
        assert len({r.epochs_run for r in loop}) > 1, [r.epochs_run for r in loop]


def test_binary_task_and_fused_adam_in_a_padded_stack():
    """One output (MSE to +-1 targets) at three widths; and torch's fused Adam, run per learning rate on the slices
    of a padded stack, equals it unpadded to float32 rounding."""
    _loop_and_stack(_width_jobs(_cfg(epochs=8), out_dim=1, seeds=(3,)))
    jobs = _width_jobs(_cfg(epochs=8), seeds=(0,))
    padded, exact = _copy(jobs), _copy(jobs)
    train_many(padded, pad=True, fused_adam=True)
    train_many(exact, pad=False, fused_adam=True)
    for a, b in zip(exact, padded, strict=True):
        assert torch.allclose(b[0].W, a[0].W, rtol=F32_REORDER, atol=F32_REORDER)


@pytest.mark.parametrize("optimizer", ["adam", "gd"])
def test_leave_one_out_networks_stack_with_the_full_network(optimizer):
    """The full network (n points) and three with a different point removed (n - 1: a last batch one row shorter)
    at two widths form one stack and equal the loop; each draws its own permutation of its own points."""
    jobs = _loo_jobs(_cfg(optimizer, epochs=10, plateau=True))
    assert len(stack_plan(jobs, pad=True)) == 1 and len(stack_plan(jobs, pad=False)) == 4
    _loop_and_stack(jobs)


def test_networks_with_another_number_of_batches_are_another_stack():
    """n = 100 and n = 96 at batch 32 take 4 and 3 Adam steps per epoch: two stacks (they could not share Adam's
    step count); under full-batch GD one step each, so one stack."""
    x, y, xt, yt = _data()
    def jobs(cfg):
        return [(TwoLayerNet(ModelSpec("relu", D, m, C), x[:n]), x[:n], y[:n], cfg, xt, yt, "")
                for n in (N, N - 1, 96) for m in (16, 64)]
    adam = jobs(_cfg(epochs=4))
    assert sorted(map(sorted, stack_plan(adam, pad=True))) == [[0, 1, 2, 3], [4, 5]]
    assert len(stack_plan(jobs(_cfg("gd", epochs=4)), pad=True)) == 1
    _loop_and_stack(adam)


def test_padded_rows_stay_exactly_zero(monkeypatch):
    """At every step of a padded stack the rows of W, of its gradient and of Adam's moments beyond each network's
    width are exactly zero (zero gradient: Adam's update there is 0 / (0 + eps) = 0), with weight decay of either
    kind."""
    seen = {"steps": 0, "padded": 0}
    real = engine._update

    def checked(st, grad, step):
        if st.padded:
            for j, net in enumerate(st.nets):
                assert not grad[j, net.width:].any()
                seen["padded"] += net.width < st.W.shape[1]
            real(st, grad, step)
            assert all(st.padded_rows_are_zero(j) for j in range(len(st.nets)))
            seen["steps"] += 1
        else:
            real(st, grad, step)

    monkeypatch.setattr(engine, "_update", checked)
    for decay in ("coupled", "decoupled"):
        train_many(_width_jobs(_cfg(epochs=4, decay=decay, weight_decay=0.1), seeds=(0,)), pad=True)
    assert seen["steps"] == 2 * 4 * 4 and seen["padded"] > 0


def test_cpu_default_is_the_exact_grouping_bit_for_bit():
    """`pad=None` on a CPU stacks only equal widths and n, bit-equal to the loop (`tests/empirics/test_engine.py`
    checks every protocol; measured at widths 16 and up: at width 8 a batched product's slice can round otherwise
    than `mm`); `stack_plan` says so without training."""
    jobs = _width_jobs(_cfg(epochs=4), widths=(16, 64), seeds=(0,))
    assert stack_plan(jobs) == stack_plan(jobs, pad=False) == [[0, 2], [1, 3]]
    loop_jobs, ours = _copy(jobs), _copy(jobs)
    loop = [train_job(j) for j in loop_jobs]
    got = train_many(ours)
    for a, b, ra, rb in zip(loop_jobs, ours, loop, got, strict=True):
        assert torch.equal(a[0].W, b[0].W) and ra.train_loss == rb.train_loss


def test_chunks_count_the_padded_sizes(monkeypatch):
    """Under a small `MAX_GROUP_BYTES` a padded group splits into chunks, widest first, each within the cap at its
    padded width (or one network alone), and still equals the loop."""
    jobs = _width_jobs(_cfg(epochs=3), seeds=(0, 1, 2))
    per = {m: (5 * m * D + N * D) * 4 for m in WIDTHS}
    monkeypatch.setitem(engine.MAX_GROUP_BYTES, "cpu", 3 * per[64] + 1)
    plan = stack_plan(jobs, pad=True)
    widths = [[jobs[i][0].spec.width for i in chunk] for chunk in plan]
    assert sorted(i for chunk in plan for i in chunk) == list(range(len(jobs)))
    assert all(len(c) * per[max(c)] <= engine.MAX_GROUP_BYTES["cpu"] for c in widths)
    assert widths[0] == [64, 64, 64] and len(plan) < len(jobs)
    _loop_and_stack(jobs)


def test_a_head_the_padded_stack_does_not_reproduce_falls_back(monkeypatch):
    """If `TwoLayerNet.head` computed something else, the padded group goes to `train` (the same as the loop)."""
    monkeypatch.setattr(TwoLayerNet, "head", lambda self, f: 2 * (torch.relu(f @ self.W.T) @ self.A) / self.width**0.5)
    groups = []
    real = engine._train_group
    monkeypatch.setattr(engine, "_train_group", lambda *a: groups.append(a[3]) or real(*a))
    jobs = _width_jobs(_cfg(epochs=2), seeds=(0,))
    loop_jobs, ours = _copy(jobs), _copy(jobs)
    loop = [train_job(j) for j in loop_jobs]
    got = train_many(ours, pad=True)
    assert groups == [True]
    for a, b, ra, rb in zip(loop_jobs, ours, loop, got, strict=True):
        assert torch.equal(a[0].W, b[0].W) and ra.train_loss == rb.train_loss


def test_the_epoch_clock_sees_every_epoch_of_every_stack_and_changes_nothing():
    """`on_epoch` is an observer: called once per epoch of each stack in order (a plateau stop ends its stack's
    calls), and the weights and records are bit-equal to a run without it (what `benchmarks.gpu_check` times)."""
    cfg = _cfg(plateau=False, epochs=5)
    jobs = _width_jobs(cfg)
    plain = _copy(jobs)
    seen: list[int] = []
    recs = train_many(jobs, pad=True, on_epoch=seen.append)
    stacks = stack_plan(plain, pad=True)
    assert seen == list(range(1, 6)) * len(stacks)
    again = train_many(plain, pad=True)
    assert [r.train_loss for r in recs] == [r.train_loss for r in again]
    assert all(torch.equal(a[0].W, b[0].W) for a, b in zip(jobs, plain, strict=True))


@pytest.mark.parametrize("pad", [False, True])
@pytest.mark.parametrize("decay", ["coupled", "decoupled"])
@pytest.mark.parametrize("optimizer", ["adam", "gd"])
def test_the_epoch_program_equals_the_step_loop_bit_for_bit(optimizer, decay, pad):
    """`capture=True` runs each epoch as one `_EpochProgram` (its Adam bias corrections read from buffers; on CUDA a
    CUDA graph, here run as it is): bit-equal to the engine's step loop, padded or not, with weight decay of either
    kind and plateau stops (networks leaving the stack rebuild the program), and leave-one-out stacks."""
    cfg = _cfg(optimizer, decay=decay, weight_decay=0.01, plateau=True)
    built = []
    real = engine._EpochProgram

    def counted(*a):
        built.append(1)
        return real(*a)

    for jobs in (_width_jobs(cfg), _loo_jobs(_cfg(optimizer, epochs=6, plateau=True))):
        eager, programmed = _copy(jobs), _copy(jobs)
        a = train_many(eager, pad=pad)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(engine, "_EpochProgram", counted)
            b = train_many(programmed, pad=pad, capture=True)
        assert all(torch.equal(x[0].W, y[0].W) for x, y in zip(eager, programmed, strict=True))
        assert [(r.epochs_run, r.train_loss, r.test_acc) for r in a] == [(r.epochs_run, r.train_loss, r.test_acc)
                                                                         for r in b]
    stacks = len(stack_plan(_width_jobs(cfg), pad=pad)) + len(stack_plan(_loo_jobs(cfg), pad=pad))
    assert len(built) > stacks  # rebuilt after plateau stops


def test_capture_with_fused_adam_is_refused():
    with pytest.raises(ValueError, match="capture and fused_adam"):
        train_many(_width_jobs(_cfg(epochs=1), seeds=(0,)), capture=True, fused_adam=True)


def test_the_epoch_program_runs_where_its_stack_is():
    """The program's buffers and every operation of its epoch on torch's `meta` device (which refuses to combine with
    a CPU tensor, as CUDA does, and as a CUDA graph capture would fail): device discipline of the captured path."""
    meta = torch.device("meta")
    jobs = _width_jobs(_cfg(epochs=1), widths=(16, 64), seeds=(0,))
    nets = [engine._prepare(i, j) for i, j in enumerate(jobs)]
    for padded in (False, True):
        group = nets if padded else [nets[0], nets[2]]
        st = engine._Stack(group, padded)
        for name in (*engine._Stack.PER_NET, "m1", "m2"):
            t = getattr(st, name)
            if isinstance(t, torch.Tensor):
                setattr(st, name, torch.empty_like(t, device=meta))
        if not padded:
            st.scale = group[0].model.spec.width ** 0.5
        program = engine._EpochProgram(st, engine.loss_fn(C), 32)
        assert {t.device for t in (program.perm, program.bias1, program.bias2, program.lr, program.offsets)} == {meta}
        program.run(torch.zeros(len(group), N, dtype=torch.long, device=meta), 1)
        assert st.W.device == meta
