"""The maths of EMA and EWC against hand computations."""

from __future__ import annotations

import torch
from torch import nn

from gpu_trainer.updates.ema import EMA
from gpu_trainer.updates.ewc import OnlineEWC
from gpu_trainer.updates.row_adam import RowSparseAdam


def test_ema_dense_and_row_sparse() -> None:
    params = {"table": torch.zeros(5, 2), "w": torch.zeros(3)}
    ema = EMA(params, momentum=0.9, sparse_names={"table"})
    new = {"table": torch.ones(5, 2), "w": torch.full((3,), 2.0)}
    ema.update(new, {"table": torch.tensor([0, 3])})
    expected_rows = torch.zeros(5, 2)
    expected_rows[[0, 3]] = 0.1
    assert torch.allclose(ema.shadow["table"], expected_rows)  # rows 1, 2, 4 untouched
    assert torch.allclose(ema.shadow["w"], torch.full((3,), 0.2))
    ema.update(new, {"table": torch.tensor([0])})
    assert torch.isclose(ema.shadow["table"][0, 0], torch.tensor(0.9 * 0.1 + 0.1))
    assert torch.isclose(ema.shadow["table"][3, 0], torch.tensor(0.1))


def test_ewc_penalty_and_gradient_match_hand_computation() -> None:
    theta_star = torch.tensor([1.0, -2.0, 0.5])
    grads_seen = [torch.tensor([1.0, 2.0, 0.0]), torch.tensor([3.0, 0.0, 1.0])]
    p = nn.Parameter(theta_star.clone())
    ewc = OnlineEWC({"p": p}, lam=4.0, fisher_momentum=0.5, decay=0.9, sparse_names=set())
    for g in grads_seen:
        ewc.observe({"p": g})
    # running = 0.5*(0.5*0 + 0.5*g1^2) + 0.5*g2^2 = 0.25*g1^2 + 0.5*g2^2
    fisher = 0.25 * grads_seen[0] ** 2 + 0.5 * grads_seen[1] ** 2
    assert torch.allclose(ewc.running["p"], fisher)
    ewc.consolidate({"p": p})
    assert torch.allclose(ewc.fisher["p"], fisher) and torch.equal(ewc.anchor["p"], theta_star)

    with torch.no_grad():
        p.copy_(torch.tensor([2.0, 0.0, 0.0]))
    delta = p.detach() - theta_star
    by_hand = 0.5 * 4.0 * float((fisher * delta**2).sum())
    assert abs(float(ewc.penalty({"p": p}).detach()) - by_hand) < 1e-5

    autograd_grad = torch.autograd.grad(ewc.penalty({"p": p}), p)[0]
    p.grad = torch.zeros(3)
    ewc.add_penalty_grad({"p": p})
    assert torch.allclose(p.grad, autograd_grad)
    assert torch.allclose(p.grad, 4.0 * fisher * delta)

    ewc.observe({"p": torch.ones(3)})
    ewc.consolidate({"p": p})  # F* <- 0.9 F* + running
    assert torch.allclose(ewc.fisher["p"], 0.9 * fisher + (0.5 * fisher + 0.5))


def test_ewc_on_sparse_embedding_gradients_touches_only_batch_rows() -> None:
    table = nn.Embedding(6, 2, sparse=True)
    params = {"weight": table.weight}
    ewc = OnlineEWC(params, lam=2.0, fisher_momentum=0.0, decay=1.0, sparse_names={"weight"})
    idx = torch.tensor([1, 4, 1])
    table(idx).sum().backward()
    ewc.observe({"weight": table.weight.grad})
    running = ewc.running["weight"]
    assert torch.equal(running[[0, 2, 3, 5]], torch.zeros(4, 2))
    assert torch.allclose(running[1], torch.full((2,), 4.0)) and torch.allclose(running[4], torch.ones(2))
    ewc.consolidate(params)
    with torch.no_grad():
        table.weight.add_(1.0)  # every row moves away from its anchor by 1
    table.weight.grad = None
    table(torch.tensor([4])).sum().backward()
    ewc.add_penalty_grad(params)
    dense_grad = table.weight.grad.to_dense()
    # row 4: data grad 1 + lam * F * delta = 1 + 2 * 1 * 1 = 3; row 1 untouched by this batch: no penalty
    assert torch.allclose(dense_grad[4], torch.full((2,), 3.0))
    assert torch.equal(dense_grad[1], torch.zeros(2))
    rows = {"weight": torch.tensor([1])}
    assert abs(float(ewc.penalty(params, rows).detach()) - 0.5 * 2.0 * 4.0 * 2) < 1e-5


def test_row_sparse_adam_steps_as_torchs_sparse_adam() -> None:
    """Same weights and moments as torch.optim.SparseAdam over steps with repeated rows, rows seen
    again, an empty gradient and maximize."""
    torch.manual_seed(3)
    for maximize in (False, True):
        ours, theirs = nn.Parameter(torch.randn(50, 4)), nn.Parameter(torch.empty(50, 4))
        theirs.data.copy_(ours.data)
        before = ours.detach().clone()
        mine = RowSparseAdam([ours], lr=0.05, betas=(0.8, 0.99), maximize=maximize)
        reference = torch.optim.SparseAdam([theirs], lr=0.05, betas=(0.8, 0.99), maximize=maximize)
        for rows in ([1, 1, 7, 49], [7, 3, 3, 3], [], [0, 49, 1]):
            grad = torch.sparse_coo_tensor(torch.tensor([rows], dtype=torch.int64), torch.randn(len(rows), 4),
                                           (50, 4), check_invariants=True)
            ours.grad, theirs.grad = grad, grad.clone()
            mine.step()
            reference.step()
            assert torch.allclose(ours, theirs, rtol=1e-5, atol=1e-6)
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.allclose(mine.state[ours][key], reference.state[theirs][key], rtol=1e-5, atol=1e-7)
        assert mine.state[ours]["step"] == reference.state[theirs]["step"] == 4
        assert torch.equal(ours[10:20], before[10:20])  # rows no gradient touched keep their weights


def test_row_sparse_adam_moments_of_a_large_table_start_at_zero() -> None:
    """A table past calloc's threshold for fresh pages (the moments are not written until a row
    trains): the moments match SparseAdam's, untouched rows stay exactly zero, and a second
    optimizer's state shares nothing with the first's."""
    torch.manual_seed(5)
    ours = nn.Parameter(torch.randn(100_000, 16))
    theirs = nn.Parameter(ours.detach().clone())
    mine, reference = RowSparseAdam([ours], lr=0.05), torch.optim.SparseAdam([theirs], lr=0.05)
    grad = torch.sparse_coo_tensor(torch.tensor([[3, 99_999, 3]]), torch.randn(3, 16), (100_000, 16))
    ours.grad, theirs.grad = grad, grad.clone()
    mine.step()
    reference.step()
    state = mine.state[ours]
    for key in ("exp_avg", "exp_avg_sq"):
        assert state[key].dtype == ours.dtype and state[key].shape == ours.shape and state[key].is_contiguous()
        assert torch.allclose(state[key], reference.state[theirs][key], rtol=1e-5, atol=1e-7)
        assert int(torch.count_nonzero(state[key][4:99_999])) == 0
    other = nn.Parameter(torch.zeros(100_000, 16))
    second = RowSparseAdam([other], lr=0.05)
    other.grad = torch.sparse_coo_tensor(torch.tensor([[3]]), torch.ones(1, 16), (100_000, 16))
    second.step()
    assert not torch.equal(second.state[other]["exp_avg"][3], state["exp_avg"][3])
    assert torch.allclose(ours, theirs, rtol=1e-5, atol=1e-6)
