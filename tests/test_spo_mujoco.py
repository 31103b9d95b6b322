"""SPO's penalised surrogate: where each sample's objective peaks, and agreement with PPO at r = 1."""

import pytest
import torch

import ppo_mujoco as ppo
import spo_mujoco as spo


def loss_and_grad(r, adv, eps=0.2):
    r = torch.tensor([r], requires_grad=True)
    loss = spo.policy_loss(r, torch.tensor([adv]), eps)
    loss.backward()
    return loss.item(), r.grad.item()


@pytest.mark.parametrize("adv", [2.0, 0.3, -0.3, -2.0])
def test_objective_peaks_at_one_plus_sign_adv_epsilon(adv):
    eps = 0.2
    peak = 1.0 + (1 if adv > 0 else -1) * eps
    # Minimising the loss: the gradient is negative left of the peak (r grows) and positive right of it.
    for d in (0.05, 0.01):
        assert loss_and_grad(peak - d, adv, eps)[1] < 0
        assert loss_and_grad(peak + d, adv, eps)[1] > 0
    assert loss_and_grad(peak, adv, eps)[1] == pytest.approx(0.0, abs=1e-6)
    # ... and a grid search over r finds the same maximiser of the objective.
    grid = torch.linspace(0.5, 1.5, 1001)
    objective = -torch.stack([spo.policy_loss(r.view(1), torch.tensor([adv]), eps) for r in grid])
    assert grid[objective.argmax()].item() == pytest.approx(peak, abs=1e-3)


def test_equals_ppo_to_first_order_at_ratio_one():
    adv = torch.tensor([1.5, -0.7, 0.2])
    for loss_fn in (spo.policy_loss, ppo.policy_loss):
        assert loss_fn(torch.ones(3), adv, 0.2).item() == pytest.approx(-adv.mean().item())
    grads = []
    for loss_fn in (spo.policy_loss, ppo.policy_loss):
        r = torch.ones(3, requires_grad=True)
        loss_fn(r, adv, 0.2).backward()
        grads.append(r.grad)
    torch.testing.assert_close(grads[0], grads[1])
    torch.testing.assert_close(grads[0], -adv / 3)
