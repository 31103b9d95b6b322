"""What the four MuJoCo scripts share: CLI, validation, simulated asynchrony, logging, saving, determinism.

Every test here runs for each script that exists, so a common part that drifts in one script fails."""

import ast
import concurrent.futures
import dataclasses
import inspect
import json
import re
import shutil
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch

from conftest import (
    MUJOCO_SCRIPTS,
    ROOT,
    SUBPROCESS_ENV,
    TINY,
    existing_scripts,
    import_script,
    read_checkpoint_file,
    read_scalars,
    run_in_process,
    run_script,
)
from tools import sync_plumbing
from tools.sync_plumbing import common_sections

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


# (argv, the error line's expected text, the scripts it applies to: None for all)
OVERLAP_NEEDS = "--overlap needs --lag-mode fixed and --lag >= 1 (the next policy known early), --torch-threads 1"
BAD_INPUT = [
    (["--lag", "-1"], "--lag must be in [0, 2**31), got -1", None),
    (["--num-envs", "3", "--num-steps", "5", "--num-minibatches", "4"], "does not divide into 4 minibatches", None),
    (["--env-id", "CartPole-v1"], "only continuous (Box)", None),
    (["--env-id", "CartPole-v1", "--env-backend", "gymnasium"], "only continuous (Box)", None),
    (["--env-id", "NoSuchEnv-v9", "--env-backend", "envpool"], "envpool: 'NoSuchEnv-v9' (nor in gymnasium's registry)", None),
    (["--env-id", "NoSuchEnv-v9"], "unknown env id: 'NoSuchEnv-v9' (not in gymnasium", None),
    (["--env-id", "Hopper-v2", "--env-backend", "envpool"], "'Hopper-v2' (a gymnasium id: try --env-backend gymnasium)", None),
    (["--env-id", "Hopper-v2"], "Hopper-v2 cannot be built: ImportError", None),  # auto: EnvPool lacks it
    (["--num-envs", "0"], "--num-envs must be in [1, 65536] (the paper's runs take 500), got 0", None),
    (["--num-envs", str(10**9), "--total-timesteps", str(10**12)], "--num-envs must be in [1, 65536]", None),
    (
        ["--num-envs", "4", "--num-steps", str(2**40), "--total-timesteps", str(2**42)],  # a batch of 2**42 steps
        "--num-envs x --num-steps is a batch of 4,398,046,511,104 steps: about ",
        None,
    ),
    (["--env-backend", "gymnasium", "--env-threads", "7"], "--env-threads 7 sets EnvPool's threads", None),
    (["--run-dir", ""], "--run-dir must name a folder, got ''", None),
    (["--resume", "--run-dir", ""], "--run-dir must name a folder, got ''", None),
    (["--overwrite"], "--overwrite needs --run-dir: the folder of the run to replace", None),
    (["--exp-name", "x\udcff"], "--exp-name is not valid UTF-8: b'x\\xff'", None),  # the bytes x, 0xff from a shell
    (["--wandb-entity", "\udce9"], "--wandb-entity is not valid UTF-8: b'\\xe9'", None),
    (["--update-epochs", "0"], "--update-epochs must be in [1, 1000], got 0", None),
    (["--update-epochs", str(2**64)], f"--update-epochs must be in [1, 1000], got {2**64}", None),  # it would never end
    (["--eval-episodes", str(2**64)], f"--eval-episodes must be in [0, 10000], got {2**64}", None),
    (["--total-timesteps", str(2**64)], f"--total-timesteps must be in [1, 2**63), got {2**64}", None),
    (["--exp-name", "a/b"], "--exp-name names files: 1 to 100 characters, not '/', '.' or '..', got 'a/b'", None),
    (["--exp-name", "../../x"], "--exp-name names files", None),
    (["--exp-name", ""], "--exp-name names files: 1 to 100 characters, not '/', '.' or '..', got ''", None),
    (["--exp-name", ".."], "--exp-name names files", None),
    (["--total-timesteps", "100"], "less than one batch", None),
    (["--learning-rate", "nan"], "--learning-rate must be a positive number, got nan", None),
    (["--env-backend", "envpool", "--capture-video"], "--capture-video needs --env-backend gymnasium", None),
    (["--gamma", "1.5"], "--gamma must be in [0, 1], got 1.5", None),
    (["--gae-lambda", "-0.5"], "--gae-lambda must be in [0, 1], got -0.5", None),
    (["--clip-coef", "-0.2"], "--clip-coef must be a positive number, got -0.2", None),
    (["--clip-coef", "0"], "--clip-coef must be a positive number, got 0.0", None),
    (["--max-grad-norm", "-1"], "--max-grad-norm must be a positive number, got -1.0", None),
    (["--target-kl", "-1"], "--target-kl must be a positive number, got -1.0", None),
    (["--target-kl", "inf"], "--target-kl must be a positive number, got inf", None),
    (["--seed", "-1"], "--seed must be in [0, 2**31), got -1", None),
    (["--seed", str(2**64)], f"--seed must be in [0, 2**31), got {2**64}", None),
    (["--seed", str(2**31)], f"--seed must be in [0, 2**31), got {2**31}", None),  # EnvPool's seed is an int32
    (["--lag", str(10**20)], f"--lag must be in [0, 2**31), got {10**20}", None),
    (["--torch-threads", str(2**31)], f"--torch-threads must be in [1, 1024], got {2**31}", None),
    (["--env-threads", "-1"], "--env-threads must be in [0, 1024], got -1", None),
    (["--vf-coef", "inf"], "--vf-coef must be a finite number >= 0, got inf", None),
    (["--ent-coef", "inf"], "--ent-coef must be a finite number >= 0, got inf", None),
    (["--lag-mode", "bogus"], "invalid choice 'bogus' for argument '--lag-mode'. Expected one of ('uniform', 'fixed').", None),
    (["--num-envs", "abc"], "Error parsing --num-envs: invalid literal for int() with base 10: 'abc'", None),
    (["--no-such-flag", "3"], "Unrecognized options: --no-such-flag, 3", None),
    (["--lag"], "Missing value for argument '--lag'. Expected 1 values.", None),
    (["--env-id", "Ant-v3"], "the evaluation runs on gymnasium: Ant-v3 cannot be built: ImportError", None),
    (["--resume"], "--resume needs --run-dir: the run's folder (printed at its start as `run folder: ...`)", None),
    (["--checkpoint-every", "-1"], "--checkpoint-every must be in [0, 2**31), got -1", None),
    (["--overlap", "--lag", "2"], OVERLAP_NEEDS, None),
    (["--overlap", "--lag-mode", "fixed"], OVERLAP_NEEDS, None),
    (["--overlap", "--lag-mode", "fixed", "--lag", "1", "--torch-threads", "2"], OVERLAP_NEEDS, None),
    (["--tv-threshold", "-1"], "--tv-threshold must be a positive number, got -1.0", {"vaco_mujoco"}),
    (["--tv-threshold", "0"], "--tv-threshold must be a positive number, got 0.0", {"vaco_mujoco"}),
    (["--tv-threshold", "inf"], "--tv-threshold must be a positive number, got inf", {"vaco_mujoco"}),
    (["--rho-bar", "0"], "--rho-bar must be a positive number, got 0.0", {"vaco_mujoco", "impala_mujoco"}),
    (["--rho-bar", "inf"], "--rho-bar must be a positive number, got inf", {"vaco_mujoco", "impala_mujoco"}),
    (["--c-bar", "-1"], "--c-bar must be a positive number, got -1.0", {"vaco_mujoco", "impala_mujoco"}),
    (["--c-bar", "0"], "--c-bar must be a positive number, got 0.0", {"vaco_mujoco", "impala_mujoco"}),
    (["--c-bar", "inf"], "--c-bar must be a positive number, got inf", {"vaco_mujoco", "impala_mujoco"}),
    (
        ["--env-id", "Hopper-v2", "--env-backend", "gymnasium"],
        "Hopper-v2 cannot be built: ImportError: The mujoco v2 and v3 based environments",
        None,
    ),
    (
        ["--env-id", "CarRacing-v3", "--env-backend", "gymnasium"],
        "CarRacing-v3 cannot be built: DependencyNotInstalled: Box2D is not installed",
        None,
    ),
    (["--num-envs", "1", "--num-steps", "32"], "a minibatch of 1 sample cannot be normalised (--norm-adv)", None),
    (["--num-envs", "65536", "--num-steps", "2000"], "--total-timesteps 100000000 is less than one batch (131072000", None),
    (["--run-dir", "/etc/hostname/run"], "--run-dir /etc/hostname/run: /etc/hostname is not a writable folder", None),
    (["--resume", "--run-dir", "/nonexistent/run"], "/nonexistent/run holds no run (no run.json)", None),
]


def bad_input_cases():
    return [
        pytest.param(script, argv, message, id=f"{script}:{' '.join(argv)}")
        for script in MUJOCO_SCRIPTS
        for argv, message, only in BAD_INPUT
        if only is None or script in only
    ]


@pytest.mark.parametrize("script,argv,message", bad_input_cases())
def test_bad_input_is_one_line_and_exit_2(script, argv, message, capsys):
    module = import_script(script)
    with pytest.raises(SystemExit) as exc:
        module.parse_args(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1, err


@pytest.mark.parametrize(
    "argv,env,message",
    [
        (["--lag=-3"], {}, r"error: --lag must be in \[0, 2\*\*31\), got -3\n"),
        (["--run-dir", "/proc/x/run"], {}, r"error: .*/proc.*\n"),  # as root: caught when the folder is made
        (["--capture-video"], {"MUJOCO_GL": None, "DISPLAY": None}, r"error: --capture-video: no OpenGL renderer .*\n"),
        (["--lag-mode", "bogus"], {}, r"error: invalid choice 'bogus' for argument '--lag-mode'\. .*\n"),
        (["--seed", str(2**64)], {}, r"error: --seed must be in \[0, 2\*\*31\), got \d+\n"),
        (["--exp-name", b"\xff"], {}, r"error: --exp-name is not valid UTF-8: b'\\xff'\n"),
        (["--exp-name", "\u20ac" * 100, "--save-model"], {}, r"error: --exp-name makes the model file's name 318 bytes .*\n"),
        (["--num-steps", str(2**40), "--total-timesteps", str(2**42)], {}, r"error: .* more than this machine's .*\n"),
        (
            ["--env-id", "Ant-v3", "--env-backend", "envpool", "--eval-episodes", "1"],
            {},
            r"error: the evaluation runs on gymnasium: .*\n",
        ),
    ],
    ids=["lag", "unwritable-run-dir", "capture-video-without-renderer", "tyro-error", "huge-seed", "not-utf8", "long-name"]
    + ["huge-batch", "eval-env"],
)
@pytest.mark.parametrize("script", existing_scripts())
def test_bad_input_exits_before_work_in_a_subprocess(script, argv, env, message, tmp_path):
    env = {k: v for k, v in {**SUBPROCESS_ENV, **env}.items() if v is not None}
    run_dir = ["--run-dir", str(tmp_path / "run")] if "--run-dir" not in argv else []
    proc = subprocess.run(
        [sys.executable, str(ROOT / f"{script}.py"), *TINY, *run_dir, *argv],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert re.fullmatch(message, proc.stderr), proc.stderr
    assert proc.stdout == "" and list(tmp_path.iterdir()) == []  # no run folder, nothing else


@pytest.mark.parametrize("script", existing_scripts())
def test_wandb_sweep_style_arguments(script):
    module = import_script(script)
    args = module.parse_args(["--track=True", "--capture_video=False", "--env_id=Hopper-v5", "--lag=4", "--save-model=true"])
    assert args.track and not args.capture_video and args.save_model
    assert args.env_id == "Hopper-v5" and args.lag == 4
    assert not module.parse_args(["--norm_adv=False"]).norm_adv
    assert module.parse_args(["--no-anneal-lr"]).anneal_lr is False


# The algorithm's building blocks that every script shares (they read with the algorithm, above the plumbing).
SHARED_BLOCKS = {
    "layer_init",
    "RunningMeanStd",
    "Agent",
    "draw_staleness",
    "total_variation",
    "scale_rewards",
    "value_loss",
}


def top_level_names(source):
    """Names that a piece of module source defines at its top level (functions, classes, assignments)."""
    names = []
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
    return names


def test_common_sections_and_shared_blocks_are_identical_across_scripts():
    """The two banner-marked common sections (the environments and the rollout; the run's plumbing), byte-identical
    in every script, hold everything that is not the algorithm; the algorithm's shared building blocks are identical
    too (the diffs show only the algorithm)."""
    sections, blocks = {}, {}
    for script in MUJOCO_SCRIPTS:
        path = ROOT / f"{script}.py"
        if not path.exists():
            continue
        text = path.read_text()
        sections[script] = common_sections(text)
        assert sections[script] is not None, f"{script} lacks a banner-marked common section"
        tree = ast.parse(text)
        names = {getattr(n, "name", None): n for n in tree.body}
        assert SHARED_BLOCKS <= set(names), f"{script} lacks {SHARED_BLOCKS - set(names)}"
        blocks[script] = {name: ast.get_source_segment(text, names[name]) for name in SHARED_BLOCKS}
        assert not SHARED_BLOCKS & set(top_level_names("".join(sections[script]))), "shared blocks read with the algorithm"
    for script in sections:
        assert sections[script] == sections["ppo_mujoco"], f"{script}'s common sections differ from ppo_mujoco's"
        for name in SHARED_BLOCKS:
            assert blocks[script][name] == blocks["ppo_mujoco"][name], f"{script}.{name} differs from ppo_mujoco.{name}"
    # What each section must hold: above main, what the algorithm sees and what the logs mean; below, the run's files.
    envs_and_rollout, plumbing = (set(top_level_names(section)) for section in sections["ppo_mujoco"])
    above = {"make_env", "GymnasiumEnvs", "EnvPoolEnvs", "make_envs", "EpisodeStats", "Rollouts", "rollout_state"}
    above |= {"Progress", "initial_state", "log_iteration", "load_agent", "evaluate", "evaluate_at_end"}
    above |= {"ENVPOOL_FROM_NUM_ENVS", "choose_backend"}  # auto's choice of backend is a choice of simulator
    assert above <= envs_and_rollout, above - envs_and_rollout
    below = {"check_args", "parse_args", "start_run", "restore_checkpoint", "save_checkpoint", "finish", "log_row"}
    below |= {"stop_on_signals", "read_checkpoint", "save_model"}
    assert below <= plumbing, below - plumbing


@pytest.mark.parametrize("script", existing_scripts())
def test_main_calls_below_the_fence_only_the_runs_start_checkpoints_and_end(script):
    """main reads top to bottom: what shapes its data (the envs, the seeds, the rollout, the first observation, the
    logs, the evaluation) is above the plumbing's banner; below it, main calls only the run's start, its checkpoints
    and its end."""
    text = (ROOT / f"{script}.py").read_text()
    plumbing = set(top_level_names(common_sections(text)[-1]))
    functions = {n.name: n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef)}
    main = functions["main"]
    used = {node.id for node in ast.walk(main) if isinstance(node, ast.Name)}
    assert used & plumbing == {"start_run", "Learner", "restore_checkpoint", "save_checkpoint", "save_model", "finish"}
    main_text = ast.get_source_segment(text, main)
    # The seeds are main's, as in CleanRL: set after start_run, before the envs and the model.
    assert main_text.index("start_run(") < main_text.index("torch.manual_seed(") < main_text.index("make_envs(")
    assert "manual_seed" not in common_sections(text)[-1]
    # The evaluation's seeds and its log are main's too: the plumbing's end writes the returns it is given.
    assert main_text.index("save_model(") < main_text.index("evaluate_at_end(") < main_text.index("finish(")
    calls = [n.func for n in ast.walk(ast.parse(common_sections(text)[-1])) if isinstance(n, ast.Call)]
    assert not {"evaluate", "evaluate_at_end"} & {f.id for f in calls if isinstance(f, ast.Name)}
    assert "seed" not in ast.get_source_segment(text, functions["finish"])


def test_common_sections_check_fails_on_a_drift_or_a_missing_banner():
    text = (ROOT / "ppo_mujoco.py").read_text()
    envs_and_rollout, plumbing = common_sections(text)
    assert "class GymnasiumEnvs" in envs_and_rollout and "def main" not in envs_and_rollout
    assert "def check_args" in plumbing and "class Agent" not in plumbing and "def main" not in plumbing
    for start, end in sync_plumbing.SECTIONS:
        assert common_sections(text.replace(end, "# the end")) is None
        assert common_sections(text.replace(start, "# the start")) is None
        assert common_sections(text + start + "\n") is None
    (first_start, first_end), (second_start, second_end) = sync_plumbing.SECTIONS
    swapped = text.replace(first_start, "@1").replace(first_end, "@2").replace(second_start, first_start)
    swapped = swapped.replace(second_end, first_end).replace("@1", second_start).replace("@2", second_end)
    assert common_sections(swapped) is None  # the plumbing above the environments and the rollout
    drifted = common_sections(text.replace("CHECKPOINT_HEADER_BYTES = ", "CHECKPOINT_HEADER_BYTES = 1 + ", 1))
    assert drifted[0] == envs_and_rollout and drifted[1] != plumbing
    drifted = common_sections(text.replace("AutoresetMode.SAME_STEP", "AutoresetMode.NEXT_STEP", 1))
    assert drifted[0] != envs_and_rollout and drifted[1] == plumbing


def test_sync_plumbing_copies_ppos_common_sections_and_check_finds_a_drift(tmp_path):
    """The one command that copies both common sections: --check names a drifted script and exits 1, the copy mends
    it and touches nothing outside them; the repository's scripts pass --check."""
    check = subprocess.run([sys.executable, "-m", "tools.sync_plumbing", "--check"], cwd=ROOT, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    for script in MUJOCO_SCRIPTS:
        shutil.copy(ROOT / f"{script}.py", tmp_path)
    for drift in [
        ("ENVPOOL_FROM_NUM_ENVS = 4", "ENVPOOL_FROM_NUM_ENVS = 5"),
        ("AutoresetMode.SAME_STEP", "AutoresetMode.NEXT_STEP"),
    ]:
        drifted = tmp_path / "spo_mujoco.py"
        original = drifted.read_text()
        assert original.count(drift[0]) == 1, drift
        drifted.write_text(original.replace(*drift).replace("SPO", "Spo", 1))
        assert sync_plumbing.sync(tmp_path, check=True) == ["spo_mujoco"]
        assert sync_plumbing.sync(tmp_path) == ["spo_mujoco"] and sync_plumbing.sync(tmp_path, check=True) == []
        assert drifted.read_text() == original.replace("SPO", "Spo", 1)  # the algorithm's part is the script's own
        drifted.write_text(original)
    for _, end in sync_plumbing.SECTIONS:
        drifted.write_text(original.replace(end, "# the end"))
        with pytest.raises(ValueError, match="spo_mujoco.py: not one pair of each section's banners, in order"):
            sync_plumbing.sync(tmp_path)
        assert drifted.read_text() == original.replace(end, "# the end")  # nothing written


@pytest.mark.parametrize("backend", ["gymnasium", "envpool"])
@pytest.mark.parametrize("script", existing_scripts())
def test_smoke_run_logs_the_keys(script, backend, tmp_path):
    out = run_script(script, *TINY, "--env-backend", backend, "--lag", "2", "--run-dir", tmp_path).stdout
    clock = r"\d+:\d\d:\d\d"
    line = rf"\[(\d)/2\] step [\d,]+ \| SPS [\d,]+ \| elapsed {clock} \| ETA {clock} \| return \S+ \| final TV \S+"
    assert [m.group(1) for m in re.finditer(line, out)] == ["1", "2"], out
    assert re.search(r"\[2/2\] .* ETA 0:00:00 ", out), out  # nothing left after the last iteration
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


def readme_snippet(marker):
    """The README's python block that contains `marker`."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    (block,) = [b for b in blocks if marker in b]
    return block


def test_save_then_evaluate_round_trip(tmp_path):
    import ppo_mujoco

    run_script("ppo_mujoco", *TINY, "--save-model", "--eval-episodes", "2", "--run-dir", tmp_path)
    saved = torch.load(tmp_path / "ppo_mujoco.cleanrl_model", weights_only=True)
    assert saved["args"]["env_id"] == "Hopper-v5"
    assert saved["agent"]["obs_rms.count"] > 100  # the observation statistics travel with the weights
    # The README's load-and-evaluate snippet runs as written against this model.
    namespace = {}
    exec(readme_snippet("load_agent(").replace("runs/Hopper-v5__ppo_mujoco__1__1700000000", str(tmp_path)), namespace)
    assert len(namespace["returns"]) == 10 and np.isfinite(namespace["returns"]).all()
    # The logged evaluation is the mean over its episodes, at the last training step (wandb's step never goes back).
    returns = ppo_mujoco.evaluate(
        ppo_mujoco.load_agent(tmp_path / "ppo_mujoco.cleanrl_model"), "Hopper-v5", 2, seed=1 + 10_000
    )
    assert read_scalars(tmp_path)["eval/episodic_return"] == [(512, pytest.approx(np.mean(returns), rel=1e-5))]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["eval_return"] == pytest.approx(np.mean(returns), rel=1e-5) and summary["interrupted"] is False


def test_non_finite_loss_stops_with_a_message(tmp_path):
    import gymnasium as gym

    def nan_reward_hopper(**kwargs):
        return gym.wrappers.TransformReward(gym.make("Hopper-v5", **kwargs), lambda r: float("nan"))

    gym.register("NaNRewardHopper-v0", entry_point=nan_reward_hopper)
    with pytest.raises(SystemExit) as exc:
        run_in_process("ppo_mujoco", *TINY, "--env-id", "NaNRewardHopper-v0", "--save-model", "--run-dir", tmp_path)
    assert "error: non-finite loss at iteration 1" in str(exc.value.code)
    assert not (tmp_path / "ppo_mujoco.cleanrl_model").exists() and not (tmp_path / "summary.json").exists()


def start_and_signal(script, run_dir, sig, *args):
    """Start a tiny run, send `sig` once its first iteration is logged; return (returncode, stdout)."""
    cmd = [sys.executable, str(ROOT / f"{script}.py"), *TINY, *args, "--run-dir", str(run_dir)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=SUBPROCESS_ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == f"run folder: {run_dir}\n"
    assert proc.stdout.readline() == "device: cpu\n"
    assert proc.stdout.readline().startswith("[1/")  # training is under way
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=300)
    return proc.returncode, out, err


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"])
def test_signal_stops_after_the_iteration_and_saves(sig, code, tmp_path):
    import ppo_mujoco

    returncode, out, err = start_and_signal("ppo_mujoco", tmp_path, sig, "--total-timesteps", "1000000", "--save-model")
    assert returncode == code, err
    assert f"{signal.Signals(sig).name}: stopping after this iteration" in out
    agent = ppo_mujoco.load_agent(tmp_path / "ppo_mujoco.cleanrl_model")  # saved and loadable
    assert agent.obs_rms.count > 100
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["interrupted"] is True and 0 < summary["global_step"] < 1_000_000
    assert (tmp_path / "checkpoint.pt").exists()


@pytest.mark.parametrize("script", existing_scripts())
def test_stopped_and_resumed_run_is_bit_identical(script, tmp_path):
    args = ["--total-timesteps", "1280", "--lag", "2", "--checkpoint-every", "2", "--save-model", "--eval-episodes", "1"]
    run_script(script, *TINY, *args, "--run-dir", tmp_path / "whole")
    returncode, out, err = start_and_signal(script, tmp_path / "parts", signal.SIGTERM, *args)
    assert returncode == 143, err
    stopped = json.loads((tmp_path / "parts" / "summary.json").read_text())
    assert stopped["interrupted"] and stopped["global_step"] < 1280
    resumed = run_script(script, "--resume", "--run-dir", tmp_path / "parts")
    assert f"[{stopped['global_step'] // 256 + 1}/5]" in resumed.stdout  # it continued where it stopped
    whole, parts = read_scalars(tmp_path / "whole"), read_scalars(tmp_path / "parts")
    timing = {"charts/SPS", "perf/rollout_seconds", "perf/update_seconds"}
    assert set(whole) == set(parts)
    for tag in set(whole) - timing:
        assert whole[tag] == parts[tag], tag
    models = [torch.load(tmp_path / d / f"{script}.cleanrl_model", weights_only=True)["agent"] for d in ("whole", "parts")]
    for key in models[0]:
        assert torch.equal(models[0][key], models[1][key]), key
    assert json.loads((tmp_path / "parts" / "summary.json").read_text())["interrupted"] is False
    assert not list((tmp_path / "parts").glob("*.tmp"))  # checkpoints are written to a temporary file, then renamed


OVERLAP_RUN = [*TINY, "--total-timesteps", "1536", "--lag", "2", "--lag-mode", "fixed", "--save-model", "--eval-episodes", "1"]
TIMING = {"charts/SPS", "perf/rollout_seconds", "perf/update_seconds"}


def record_rollouts_started_early(monkeypatch, then=None):
    """Make the thread pool record the iteration at which each early rollout starts, and that it runs in another
    thread; `then(count)` runs after each start, in the main thread."""
    started, submitted, submit = [], [], concurrent.futures.ThreadPoolExecutor.submit

    def recording_submit(pool, fn, *args):
        iteration = inspect.currentframe().f_back.f_locals["iteration"]  # Rollouts.start_next's argument

        def in_the_thread(*args):
            started.append((iteration, fn.__name__, threading.current_thread() is not threading.main_thread()))
            return fn(*args)

        future = submit(pool, in_the_thread, *args)
        submitted.append(iteration)
        if then:
            then(len(submitted))
        return future

    monkeypatch.setattr(concurrent.futures.ThreadPoolExecutor, "submit", recording_submit)
    return started


def assert_same_run(a, b, script):
    """Everything two runs logged and saved is equal, timing aside."""
    sa, sb = read_scalars(a), read_scalars(b)
    assert set(sa) == set(sb)
    for tag in set(sa) - TIMING:
        assert sa[tag] == sb[tag], tag
    models = [torch.load(d / f"{script}.cleanrl_model", weights_only=True)["agent"] for d in (a, b)]
    for key in models[0]:
        assert torch.equal(models[0][key], models[1][key]), key


@pytest.mark.parametrize("script", existing_scripts())
def test_overlap_runs_the_next_rollout_during_the_update_with_the_same_results(script, tmp_path, monkeypatch):
    """6 iterations, a checkpoint every 3: the rollouts of iterations 2 to 6 start during the update before them, in
    the pool's thread, the checkpoints' included. Logs, model and both checkpoints: the sequential loop's bits."""
    run_in_process(script, *OVERLAP_RUN, "--checkpoint-every", "3", "--run-dir", tmp_path / "sequential")
    started = record_rollouts_started_early(monkeypatch)
    run_in_process(script, *OVERLAP_RUN, "--checkpoint-every", "3", "--overlap", "--run-dir", tmp_path / "overlap")
    assert started == [(i, "collect_rollout", True) for i in (1, 2, 3, 4, 5)]
    assert_same_run(tmp_path / "sequential", tmp_path / "overlap", script)
    for name, iteration in (("checkpoint.prev.pt", 3), ("checkpoint.pt", 6)):
        a, b = (read_checkpoint_file(tmp_path / d / name) for d in ("sequential", "overlap"))
        assert a.keys() == b.keys() and a["progress"]["iteration"] == iteration
        for key in a.keys() - {"progress"}:
            assert repr(a[key]) == repr(b[key]), (name, key)
        untimed = [{k: v for k, v in c["progress"].items() if "seconds" not in k and k != "elapsed"} for c in (a, b)]
        assert untimed[0] == untimed[1]


def test_a_signal_during_an_overlapped_update_stops_after_it(tmp_path, monkeypatch):
    """SIGTERM while iteration 2's update runs beside iteration 3's rollout: the run stops after iteration 2, as one
    step after the other, with that iteration's checkpoint; resumed, the run is the one never stopped."""
    run_script("ppo_mujoco", *OVERLAP_RUN, "--run-dir", tmp_path / "whole")

    def signal_at_the_second(count):
        if count == 2:
            signal.raise_signal(signal.SIGTERM)

    started = record_rollouts_started_early(monkeypatch, then=signal_at_the_second)
    with pytest.raises(SystemExit) as exc:
        run_in_process("ppo_mujoco", *OVERLAP_RUN, "--overlap", "--run-dir", tmp_path / "parts")
    assert exc.value.code == 143 and [i for i, _, _ in started] == [1, 2]
    assert read_checkpoint_file(tmp_path / "parts" / "checkpoint.pt")["progress"]["iteration"] == 2
    assert json.loads((tmp_path / "parts" / "summary.json").read_text())["global_step"] == 2 * 256
    resumed = run_script("ppo_mujoco", "--resume", "--run-dir", tmp_path / "parts")
    assert "[3/6]" in resumed.stdout
    assert_same_run(tmp_path / "whole", tmp_path / "parts", "ppo_mujoco")


def test_resume_refuses_changed_arguments(tmp_path, capsys):
    import ppo_mujoco

    run_script("ppo_mujoco", *TINY, "--checkpoint-every", "1", "--run-dir", tmp_path)
    with pytest.raises(SystemExit):
        ppo_mujoco.parse_args(["--resume", "--run-dir", str(tmp_path), "--lag", "3", "--gamma", "0.9"])
    assert capsys.readouterr().err == "error: --resume keeps the run's arguments; cannot change gamma, lag\n"
    args = ppo_mujoco.parse_args(["--resume", "--run-dir", str(tmp_path), "--save-model", "--torch-threads", "2"])
    assert args.save_model and args.torch_threads == 2 and args.num_envs == 4 and args.resume  # saved, plus safe changes
    # --overwrite replaces the run: nothing of the first one is left.
    first_events = set(tmp_path.glob("events.out.tfevents.*"))
    run_script("ppo_mujoco", *TINY, "--checkpoint-every", "0", "--overwrite", "--run-dir", tmp_path)
    assert not first_events & set(tmp_path.glob("events.out.tfevents.*")) and not (tmp_path / "checkpoint.pt").exists()


def run_from(cwd, script, *args):
    """`python <script>.py args...` from the folder cwd (the run folder's default is relative to it)."""
    command = [sys.executable, str(ROOT / f"{script}.py"), *map(str, args)]
    return subprocess.run(command, cwd=cwd, env=SUBPROCESS_ENV, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("script", existing_scripts())
def test_resume_finds_the_run_wherever_it_is(script, tmp_path):
    """A run in the default folder resumes with the README's command, by any spelling of its folder and from a copy
    elsewhere; a run folder without a checkpoint starts afresh with its saved arguments."""
    first = run_from(tmp_path, script, *TINY, "--checkpoint-every", "1")
    assert first.returncode == 0, first.stderr
    (run,) = (tmp_path / "runs").iterdir()
    assert json.loads((run / "args.json").read_text())["run_dir"] == str(run)
    # The checkpoint before the last is kept: back to it, the resumed run has its second iteration to do.
    iterations = [read_checkpoint_file(run / f)["progress"]["iteration"] for f in ("checkpoint.prev.pt", "checkpoint.pt")]
    assert iterations == [1, 2]
    shutil.copy(run / "checkpoint.prev.pt", run / "checkpoint.pt")
    (run / "summary.json").unlink()  # as if it had stopped in its second iteration: a finished run is not resumed
    copy = tmp_path / "elsewhere" / "copy"
    shutil.copytree(run, copy)
    for cwd, folder in [(tmp_path, f"runs/{run.name}/"), (tmp_path / "elsewhere", copy)]:
        resumed = run_from(cwd, script, "--resume", "--run-dir", folder)
        assert resumed.returncode == 0, resumed.stderr
        assert "[2/2]" in resumed.stdout and "[1/2]" not in resumed.stdout, resumed.stdout
    for checkpoint in [*copy.glob("checkpoint*.pt"), copy / "summary.json"]:  # as if it died before its first one
        checkpoint.unlink()
    restarted = run_from(tmp_path, script, "--resume", "--run-dir", copy)
    assert restarted.returncode == 0, restarted.stderr
    assert "no checkpoint yet: the run starts afresh" in restarted.stdout and "[1/2]" in restarted.stdout
    assert json.loads((copy / "summary.json").read_text())["global_step"] == 512


@pytest.mark.parametrize("script", existing_scripts())
def test_auto_backend_is_gymnasium_for_few_envs_and_envpool_for_many(script):
    module = import_script(script)
    shape = ["--env-id", "Hopper-v5", "--num-steps", "64", "--total-timesteps", "100000"]
    few, many = module.ENVPOOL_FROM_NUM_ENVS - 1, module.ENVPOOL_FROM_NUM_ENVS
    assert module.parse_args([*shape, "--num-envs", str(few)]).env_backend == "gymnasium"
    assert module.parse_args([*shape, "--num-envs", str(many)]).env_backend == "envpool"
    assert module.parse_args([*shape, "--num-envs", "1", "--env-backend", "envpool"]).env_backend == "envpool"
    # EnvPool has Ant-v3, gymnasium does not: it trains on EnvPool where no evaluation needs gymnasium.
    assert module.parse_args(["--env-id", "Ant-v3", "--eval-episodes", "0"]).env_backend == "envpool"
    args = module.Args(num_envs=many)
    assert module.choose_backend(dataclasses.replace(args, env_id="Hopper-v2")) == "gymnasium"  # EnvPool lacks it
    assert module.choose_backend(dataclasses.replace(args, capture_video=True)) == "gymnasium"


def test_capture_video_headless(tmp_path):
    # Hopper falls within the first rollout, so episode 0 is complete and written.
    run_script("ppo_mujoco", *TINY, "--capture-video", "--run-dir", tmp_path, env={"MUJOCO_GL": "egl"})
    assert list((tmp_path / "videos").glob("*.mp4"))


def test_track_offline_writes_a_wandb_run(tmp_path):
    """wandb's files go to the run folder; every start of the run continues the run's one wandb run (its id)."""
    run = tmp_path / "run"
    env = {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path / "elsewhere")}
    run_script("ppo_mujoco", *TINY, "--track", "--checkpoint-every", "1", "--run-dir", run, env=env)
    run_id = json.loads((run / "run.json").read_text())["run_id"]
    assert [p.name.split("-")[-1] for p in (run / "wandb").glob("offline-run-*")] == [run_id]
    assert not (tmp_path / "elsewhere").exists()
    (run / "summary.json").unlink()  # as if it had stopped after its last checkpoint: resumed, it starts once more
    run_script("ppo_mujoco", "--resume", "--run-dir", run, env=env)
    assert [p.name.split("-")[-1] for p in (run / "wandb").glob("offline-run-*")] == [run_id, run_id]
    # --overwrite replaces the run, its wandb files included.
    run_script("ppo_mujoco", *TINY, "--track", "--overwrite", "--run-dir", run, env=env)
    new_id = json.loads((run / "run.json").read_text())["run_id"]
    assert new_id != run_id and [p.name.split("-")[-1] for p in (run / "wandb").glob("offline-run-*")] == [new_id]


@pytest.mark.parametrize("script", existing_scripts())
def test_env_threads_with_the_auto_backend_is_taken(script):
    """A launcher gives every run its cores as --env-threads; auto's choice of gymnasium (few envs) leaves them unused
    instead of refusing the run. Chosen by the user, gymnasium with --env-threads is refused (BAD_INPUT)."""
    argv = ["--num-envs", "2", "--num-steps", "64", "--total-timesteps", "128", "--num-minibatches", "2", "--env-threads", "2"]
    args = import_script(script).parse_args([*argv, "--eval-episodes", "0"])
    assert (args.env_backend, args.env_threads) == ("gymnasium", 2)
