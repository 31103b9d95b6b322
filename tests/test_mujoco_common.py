"""What the four MuJoCo scripts share: CLI, validation, simulated asynchrony, logging, saving, determinism.

Every test here runs for each script that exists, so a common part that drifts in one script fails."""

import ast
import json
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import MUJOCO_SCRIPTS, ROOT, SUBPROCESS_ENV, TINY, existing_scripts, read_scalars, run_in_process, run_script

COMMON_KEYS = {
    "charts/episodic_return",
    "charts/episodic_length",
    "charts/SPS",
    "charts/learning_rate",
    "losses/value_loss",
    "losses/policy_loss",
    "losses/entropy",
    "losses/old_approx_kl",
    "losses/approx_kl",
    "losses/explained_variance",
    "lag/staleness_mean",
    "lag/staleness_max",
    "lag/backward_tv",
    "lag/final_tv",
    "perf/rollout_seconds",
    "perf/update_seconds",
}

SCRIPT_KEYS = {
    "ppo_mujoco": {"losses/clipfrac"},
    "vaco_mujoco": {"vaco/tv", "vaco/over_budget_frac", "vaco/filter_frac"},
    "spo_mujoco": {"losses/ratio_dev"},
    "impala_mujoco": set(),
}


def import_script(script):
    return __import__(script)


BAD_INPUT = [
    (["--lag", "-1"], "--lag must be >= 0"),
    (["--num-envs", "3", "--num-steps", "5", "--num-minibatches", "4"], "does not divide into 4 minibatches"),
    (["--env-id", "CartPole-v1"], "only continuous (Box)"),
    (["--env-id", "NoSuchEnv-v9"], "unknown env id"),
    (["--env-id", "NoSuchEnv-v9", "--env-backend", "envpool"], "unknown env id for envpool"),
    (["--num-envs", "0"], "--num-envs must be positive"),
    (["--update-epochs", "0"], "--update-epochs must be positive"),
    (["--total-timesteps", "100"], "less than one batch"),
    (["--learning-rate", "nan"], "--learning-rate must be a positive number"),
    (["--env-backend", "envpool", "--capture-video"], "--capture-video needs --env-backend gymnasium"),
]


@pytest.mark.parametrize("script", existing_scripts())
@pytest.mark.parametrize("argv,message", BAD_INPUT, ids=[m for _, m in BAD_INPUT])
def test_bad_input_is_one_line_and_exit_2(script, argv, message, capsys):
    module = import_script(script)
    with pytest.raises(SystemExit) as exc:
        module.parse_args(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1


@pytest.mark.parametrize("script", existing_scripts())
def test_bad_input_exits_before_work_in_a_subprocess(script):
    before = set((ROOT / "runs").glob("*")) if (ROOT / "runs").exists() else set()
    proc = run_script(script, "--lag=-3", check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: --lag must be >= 0, got -3"
    after = set((ROOT / "runs").glob("*")) if (ROOT / "runs").exists() else set()
    assert after == before  # no run directory was created


@pytest.mark.parametrize("script", existing_scripts())
def test_wandb_sweep_style_arguments(script):
    module = import_script(script)
    args = module.parse_args(["--track=True", "--capture_video=False", "--env_id=Hopper-v5", "--lag=4", "--save-model=true"])
    assert args.track and not args.capture_video and args.save_model
    assert args.env_id == "Hopper-v5" and args.lag == 4
    assert not module.parse_args(["--norm_adv=False"]).norm_adv
    assert module.parse_args(["--no-anneal-lr"]).anneal_lr is False


def test_common_code_is_identical_across_scripts():
    """The building blocks every script shares must stay byte-identical (the diffs show only the algorithm)."""
    common = {
        "check_args",
        "parse_args",
        "make_env",
        "GymnasiumEnvs",
        "EnvPoolEnvs",
        "layer_init",
        "RunningMeanStd",
        "Agent",
        "load_agent",
        "evaluate",
        "draw_staleness",
        "total_variation",
        "value_loss",
        "format_eta",
    }
    sources = {}
    for script in MUJOCO_SCRIPTS:
        path = ROOT / f"{script}.py"
        if not path.exists():
            continue
        text = path.read_text()
        tree = ast.parse(text)
        sources[script] = {n.name: ast.get_source_segment(text, n) for n in tree.body if getattr(n, "name", None) in common}
        assert set(sources[script]) == common, f"{script} lacks {common - set(sources[script])}"
    for script, defs in sources.items():
        for name in common:
            assert defs[name] == sources["ppo_mujoco"][name], f"{script}.{name} differs from ppo_mujoco.{name}"


@pytest.mark.parametrize("backend", ["gymnasium", "envpool"])
@pytest.mark.parametrize("script", existing_scripts())
def test_smoke_run_logs_the_keys(script, backend, tmp_path):
    run_script(script, *TINY, "--env-backend", backend, "--lag", "2", "--run-dir", tmp_path)
    scalars = read_scalars(tmp_path)
    expected = COMMON_KEYS | SCRIPT_KEYS[script]
    assert expected <= set(scalars), expected - set(scalars)
    assert [s for s, _ in scalars["charts/SPS"]] == [256, 512]
    assert all(np.isfinite(v) for tag in COMMON_KEYS for _, v in scalars[tag] if tag != "losses/explained_variance")
    args = json.loads((tmp_path / "args.json").read_text())
    assert args["env_backend"] == backend and args["lag"] == 2
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["global_step"] == 512 and summary["final_tv"] >= 0


def test_smoke_halfcheetah(tmp_path):
    run_script("ppo_mujoco", *TINY, "--env-id", "HalfCheetah-v5", "--run-dir", tmp_path)
    scalars = read_scalars(tmp_path)
    assert COMMON_KEYS - {"charts/episodic_return", "charts/episodic_length"} <= set(scalars)
    assert "charts/episodic_return" not in scalars  # 1000-step episodes: none finished in 128 steps


@pytest.mark.parametrize("script", existing_scripts())
def test_lag_zero_first_ratio_is_one_and_lag_is_measured(script, tmp_path):
    # lag 0: the acting policy is the learner's policy at the start of the update, so pi_T / beta = 1.
    run_script(script, *TINY, "--total-timesteps", "768", "--run-dir", tmp_path / "lag0")
    scalars = read_scalars(tmp_path / "lag0")
    assert max(v for _, v in scalars["lag/backward_tv"]) < 1e-6
    assert max(v for _, v in scalars["lag/staleness_max"]) == 0
    # fixed lag 1: from the second iteration on, every actor is one update behind.
    run_script(script, *TINY, "--total-timesteps", "768", "--lag", "1", "--lag-mode", "fixed", "--run-dir", tmp_path / "lag1")
    scalars = read_scalars(tmp_path / "lag1")
    assert [v for _, v in scalars["lag/staleness_max"]] == [0, 1, 1]
    assert [v for _, v in scalars["lag/staleness_mean"]] == [0, 1, 1]
    tv = [v for _, v in scalars["lag/backward_tv"]]
    assert tv[0] < 1e-6 and tv[1] > 1e-3 and tv[2] > 1e-3


def test_behaviour_logprobs_are_the_acting_snapshots(tmp_path):
    g = run_in_process("ppo_mujoco", *TINY, "--total-timesteps", "1024", "--lag", "3", "--run-dir", tmp_path)
    buffer, staleness = g["policy_buffer"], g["staleness"]
    assert len(buffer) == 4 and staleness.max() <= 3 and len(set(staleness.tolist())) > 1
    obs, actions, logprobs = g["obs"], g["actions"], g["logprobs"]
    for e, k in enumerate(staleness):
        with torch.no_grad():
            own = buffer[-1 - k].get_dist(obs[:, e]).log_prob(actions[:, e]).sum(1)
            other = buffer[-1 - (k + 1) % 4].get_dist(obs[:, e]).log_prob(actions[:, e]).sum(1)
        torch.testing.assert_close(own, logprobs[:, e])
        assert (own - other).abs().max() > 1e-4  # the snapshots really differ (obs statistics included)
    assert not torch.equal(buffer[0].obs_rms.mean, buffer[-1].obs_rms.mean)


@pytest.mark.parametrize("script", existing_scripts())
def test_same_seed_same_result(script, tmp_path):
    for name in ("a", "b"):
        run_script(script, *TINY, "--lag", "2", "--save-model", "--run-dir", tmp_path / name)
    models = [torch.load(tmp_path / n / f"{script}.cleanrl_model", weights_only=True)["agent"] for n in ("a", "b")]
    for key in models[0]:
        assert torch.equal(models[0][key], models[1][key]), key
    sa, sb = read_scalars(tmp_path / "a"), read_scalars(tmp_path / "b")
    for tag in ("losses/policy_loss", "lag/final_tv", "charts/episodic_return"):
        assert sa[tag] == sb[tag]
    run_script(script, *TINY, "--lag", "2", "--save-model", "--seed", "2", "--run-dir", tmp_path / "c")
    other = torch.load(tmp_path / "c" / f"{script}.cleanrl_model", weights_only=True)["agent"]
    assert not torch.equal(other["actor_logstd"], models[0]["actor_logstd"])


def test_save_then_evaluate_round_trip(tmp_path):
    import ppo_mujoco

    run_script("ppo_mujoco", *TINY, "--save-model", "--eval-episodes", "2", "--run-dir", tmp_path)
    saved = torch.load(tmp_path / "ppo_mujoco.cleanrl_model", weights_only=True)
    assert saved["args"]["env_id"] == "Hopper-v5"
    assert saved["agent"]["obs_rms.count"] > 100  # the observation statistics travel with the weights
    agent = ppo_mujoco.load_agent(tmp_path / "ppo_mujoco.cleanrl_model")
    returns = ppo_mujoco.evaluate(agent, "Hopper-v5", 2, seed=1 + 10_000)
    logged = [v for _, v in read_scalars(tmp_path)["eval/episodic_return"]]
    np.testing.assert_allclose(returns, logged, rtol=1e-5)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["eval_return"] == pytest.approx(np.mean(returns), rel=1e-5)


def test_non_finite_loss_stops_with_a_message(tmp_path):
    import gymnasium as gym

    def nan_reward_hopper(**kwargs):
        return gym.wrappers.TransformReward(gym.make("Hopper-v5", **kwargs), lambda r: float("nan"))

    gym.register("NaNRewardHopper-v0", entry_point=nan_reward_hopper)
    with pytest.raises(SystemExit) as exc:
        run_in_process("ppo_mujoco", *TINY, "--env-id", "NaNRewardHopper-v0", "--save-model", "--run-dir", tmp_path)
    assert "error: non-finite loss at iteration 1" in str(exc.value.code)
    assert not (tmp_path / "ppo_mujoco.cleanrl_model").exists() and not (tmp_path / "summary.json").exists()


def test_ctrl_c_still_saves_the_model(tmp_path):
    cmd = [
        sys.executable,
        str(ROOT / "ppo_mujoco.py"),
        *TINY,
        "--total-timesteps",
        "1000000",
        "--save-model",
        "--run-dir",
        str(tmp_path),
    ]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=SUBPROCESS_ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().startswith("[1/")  # training is under way
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "interrupted at step" in out
    assert (tmp_path / "ppo_mujoco.cleanrl_model").exists()


def test_capture_video_headless(tmp_path):
    # Hopper falls within the first rollout, so episode 0 is complete and written.
    run_script("ppo_mujoco", *TINY, "--capture-video", "--run-dir", tmp_path, env={"MUJOCO_GL": "egl"})
    assert list((tmp_path / "videos").glob("*.mp4"))


def test_track_offline_writes_a_wandb_run(tmp_path):
    run_script(
        "ppo_mujoco",
        *TINY,
        "--track",
        "--run-dir",
        tmp_path / "run",
        env={"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path)},
    )
    assert list((tmp_path / "wandb").glob("offline-run-*"))
