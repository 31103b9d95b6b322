"""VACO: V-trace realignment against a brute-force computation, the GAE identity, and the TV filter."""

import numpy as np
import pytest
import torch

import ppo_mujoco as ppo
import vaco_mujoco as vaco
from conftest import TINY, read_scalars, run_in_process, run_script
from reference import brute_force_vtrace, random_batch


@pytest.mark.parametrize("rho_bar", [0.5, 1.0, 2.0])
@pytest.mark.parametrize("lam", [0.95, 1.0])
def test_vtrace_matches_brute_force(rho_bar, lam):
    batch = random_batch(T=10, E=3, seed=1)
    log_rhos = 0.6 * torch.randn(10, 3, generator=torch.Generator().manual_seed(5))
    adv, vs = vaco.vtrace(*batch, log_rhos, gamma=0.97, gae_lambda=lam, rho_bar=rho_bar, c_bar=1.0)
    exp_vs, v_next, _ = brute_force_vtrace(*batch, log_rhos, 0.97, lam, rho_bar, 1.0)
    r, v, nv, term = (x.numpy() for x in batch[:4])
    exp_adv = r + 0.97 * (1 - term) * (lam * v_next + (1 - lam) * nv) - v
    np.testing.assert_allclose(vs.numpy(), exp_vs, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(adv.numpy(), exp_adv, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("lam", [0.0, 0.5, 0.95])
def test_vtrace_without_lag_is_gae(lam):
    batch = random_batch(T=16, E=4, seed=2)
    adv, vs = vaco.vtrace(*batch, torch.zeros(16, 4), gamma=0.99, gae_lambda=lam, rho_bar=1.0, c_bar=1.0)
    gae_adv, gae_returns = ppo.compute_gae(*batch, gamma=0.99, gae_lambda=lam)
    torch.testing.assert_close(adv, gae_adv)
    torch.testing.assert_close(vs, gae_returns)


@pytest.mark.parametrize(
    "flags",
    [["--no-filter"], ["--no-realign", "--lag", "2", "--rho-bar", "0.5", "--c-bar", "0.5"]],
    ids=["lag0-realigned", "no-realign-truncated"],
)
def test_advantages_equal_ppo_gae_without_lag_or_realignment(flags, tmp_path):
    # At lag 0 the realignment is GAE; with --no-realign it is GAE whatever the lag and the truncation levels.
    g = run_in_process("vaco_mujoco", *TINY, *flags, "--run-dir", tmp_path)
    if "--lag" in flags:
        assert (g["start_logprobs"] - g["logprobs"]).abs().max() > 1e-3  # there is lag to ignore
    gae_adv, gae_returns = ppo.compute_gae(
        g["rewards"], g["values"], g["next_values"], g["terminations"], g["dones"], 0.99, 0.95
    )
    torch.testing.assert_close(g["advantages"], gae_adv, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(g["returns"], gae_returns, atol=1e-5, rtol=1e-5)


def test_realignment_uses_the_log_ratio_of_pi_T_to_beta_under_lag(tmp_path):
    # Fixed lag 2, third iteration: every actor acted with the policy of two updates ago.
    g = run_in_process(
        "vaco_mujoco", *TINY, "--total-timesteps", "768", "--lag", "2", "--lag-mode", "fixed", "--run-dir", tmp_path
    )
    assert (g["staleness"] == 2).all()
    pi_T, beta = g["policy_buffer"][-1], g["policy_buffer"][0]  # the learner before the update, the acting policy
    obs, actions = g["obs"], g["actions"]
    with torch.no_grad():
        log_rhos = pi_T.get_dist(obs).log_prob(actions).sum(-1) - beta.get_dist(obs).log_prob(actions).sum(-1)
    assert log_rhos.abs().mean() > 1e-2
    batch = (g["rewards"], g["values"], g["next_values"], g["terminations"], g["dones"])
    exp_vs, v_next, _ = brute_force_vtrace(*batch, log_rhos, 0.99, 0.95, 1.0, 1.0)
    r, v, nv, term = (x.numpy() for x in batch[:4])
    exp_adv = r + 0.99 * (1 - term) * (0.95 * v_next + 0.05 * nv) - v
    np.testing.assert_allclose(g["advantages"].numpy(), exp_adv, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(g["returns"].numpy(), exp_vs, rtol=1e-4, atol=1e-4)
    # ... which differs from what zero log-ratios (a mis-wired ratio) would give.
    assert not torch.allclose(
        g["advantages"], vaco.vtrace(*batch, torch.zeros_like(log_rhos), 0.99, 0.95, 1.0, 1.0)[0], atol=1e-3
    )


def filter_grads(logratio, advantages, tv_threshold):
    logratio = logratio.clone().requires_grad_(True)
    loss, tv, over_budget, mask = vaco.policy_loss(logratio, advantages, tv_threshold)
    assert over_budget == (tv.item() > tv_threshold / 2)
    loss.backward()
    return logratio.grad, tv, mask


def test_filter_under_budget_keeps_every_unclipped_gradient():
    logratio = torch.log(torch.tensor([1.05, 0.95, 1.1, 0.9]))
    adv = torch.tensor([1.0, 1.0, -2.0, -2.0])
    grad, tv, mask = filter_grads(logratio, adv, tv_threshold=0.2)
    assert tv.item() == pytest.approx(0.5 * (0.05 + 0.05 + 0.1 + 0.1) / 4) and tv.item() <= 0.1
    assert mask.tolist() == [1, 1, 1, 1]
    # d/dlogratio of -mean(r A) is -r A / N: the unclipped importance-sampled gradient.
    torch.testing.assert_close(grad, -logratio.exp() * adv / 4)


def test_filter_over_budget_masks_exactly_the_tv_increasing_samples():
    r = torch.tensor([1.5, 0.5, 1.5, 0.5, 1.0, 1.2])
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0, 1.0, 0.0])
    grad, tv, mask = filter_grads(torch.log(r), adv, tv_threshold=0.2)
    assert tv.item() > 0.1
    # A>0 & r>1 and A<0 & r<1 move r away from 1: masked. The others (and r = 1, A = 0) are kept.
    assert mask.tolist() == [0, 1, 1, 0, 1, 1]
    assert grad[0] == 0 and grad[3] == 0
    torch.testing.assert_close(grad[[1, 2, 4]], -r[[1, 2, 4]] * adv[[1, 2, 4]] / 6)


def test_filter_sign_survives_underflow():
    # Densities of exp(-2000) underflow to 0 (0/0 = NaN as a probability ratio); the log ratio keeps the sign.
    log_pi, log_beta = torch.tensor([-2000.0, -2001.0]), torch.tensor([-2001.0, -2000.0])
    assert torch.isnan(log_pi.exp() / log_beta.exp()).all()
    grad, tv, mask = filter_grads(log_pi - log_beta, torch.tensor([1.0, 1.0]), tv_threshold=0.2)
    assert mask.tolist() == [0, 1] and torch.isfinite(grad).all() and torch.isfinite(tv)


def test_filter_off_is_the_plain_surrogate():
    logratio, adv = torch.log(torch.tensor([2.0, 0.5])), torch.tensor([1.0, 1.0])
    loss, tv, over_budget, mask = vaco.policy_loss(logratio, adv, 0.2, use_filter=False)
    assert mask.tolist() == [1, 1] and loss.item() == pytest.approx(-(2.0 + 0.5) / 2)
    assert over_budget and tv.item() == pytest.approx(0.5 * (1.0 + 0.5) / 2)  # reported, not acted on


def test_smoke_logs_vaco_keys_and_ablation_flags(tmp_path):
    run_script(
        "vaco_mujoco", *TINY, "--lag", "2", "--lag-mode", "fixed", "--tv-threshold", "1e-6", "--run-dir", tmp_path / "a"
    )
    scalars = read_scalars(tmp_path / "a")
    assert {"vaco/tv", "vaco/over_budget_frac", "vaco/filter_frac"} <= set(scalars)
    assert "losses/clipfrac" not in scalars
    # delta ~ 0: every minibatch is over budget, except the very first (lag 0 there, so D is exactly 0).
    assert [v for _, v in scalars["vaco/over_budget_frac"]] == [7 / 8, 1.0]
    assert all(0.2 < v < 0.8 for _, v in scalars["vaco/filter_frac"])
    run_script(
        "vaco_mujoco",
        *TINY,
        "--lag",
        "2",
        "--no-filter",
        "--no-realign",
        "--tv-threshold",
        "1e-6",
        "--run-dir",
        tmp_path / "b"
    )
    assert all(v == 0.0 for _, v in read_scalars(tmp_path / "b")["vaco/filter_frac"])
