"""vaco_gsm8k.py's options of TRL's GRPOTrainer, against TRL 1.16.0 itself (a test dependency): the loss types and
the KL to the reference through GRPOTrainer._compute_loss, the reward scalings through TRL's own code lines and its
nanstd, the learning-rate schedules against transformers' get_scheduler; then each flag in a short run of the tiny
offline model (tools/tiny_gsm8k.py)."""

import collections
import json
import os
import types

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

import vaco_gsm8k as V  # noqa: E402
from tools.tiny_gsm8k import digit_fraction, write_gsm8k_jsonl, write_tiny_model  # noqa: E402

torch.set_num_threads(1)


def trl():
    """TRL's GRPOTrainer and nanstd; the test fails, saying why, where TRL is not installed (requirements.txt)."""
    try:
        from trl.trainer.grpo_trainer import GRPOTrainer
        from trl.trainer.utils import nanstd
    except ImportError as error:
        pytest.fail(f"TRL is needed to compare with it: pip install trl==1.16.0 ({error})")
    return GRPOTrainer, nanstd


def trl_trainer(loss_type, beta, logp, accumulation, steps_per_generation, max_completion_length):
    """What GRPOTrainer._compute_loss reads of its trainer, for one process in training mode with no vLLM, entropy
    bonus or masking; its log-probs are `logp`, the micro-batch's rows of the learner's."""
    return types.SimpleNamespace(
        loss_type=loss_type,
        beta=beta,
        epsilon_low=V.Args.clip_low,
        epsilon_high=V.Args.clip_high,
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level="token",
        use_vllm=False,
        aux_loss_enabled=False,
        _entropy_bonus_enabled=False,
        model=types.SimpleNamespace(training=True),
        current_gradient_accumulation_steps=accumulation,
        max_completion_length=max_completion_length,
        args=types.SimpleNamespace(delta=None, use_bias_correction_kl=False, steps_per_generation=steps_per_generation),
        accelerator=types.SimpleNamespace(num_processes=1, gather=lambda x: x, reduce=lambda x, reduction: x),
        _metrics={"train": collections.defaultdict(list)},
        _get_per_token_logps_and_entropies=lambda *a, **k: (logp, torch.zeros_like(logp), None),
    )


def ragged_generation_batch(K=2, sequences=8, width=6, seed=0):
    """K minibatches of ragged completions: log-probs of the learner, the behaviour policy and the reference, masks
    with rows of every length (an empty one too), advantages of both signs."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, width + 1, (K, sequences), generator=g)
    lengths[0, 0], lengths[-1, -1] = 0, width
    mask = torch.arange(width)[None, None, :] < lengths[..., None]
    logp = -torch.rand(K, sequences, width, generator=g, dtype=torch.float64).float() * 3
    behaviour = logp + 0.4 * torch.randn(K, sequences, width, generator=g)
    reference = logp + 0.3 * torch.randn(K, sequences, width, generator=g)
    advantages = torch.randn(K, sequences, generator=g)
    return logp, behaviour, reference, advantages, mask


@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
def test_loss_types_and_kl_equal_trls_compute_loss(loss_type, beta):
    """Each optimizer step of a generation batch of K = 2 minibatches, in micro-batches of 2 (gradient accumulation
    4): the step's loss and its gradient equal the sum of TRL's micro-batch losses (per_device_train_batch_size 2,
    steps_per_generation 8 micro-steps) and of their gradients."""
    GRPOTrainer, _ = trl()
    K, sequences, width, micro = 2, 8, 6, 2
    logp_all, behaviour, reference, advantages, mask = ragged_generation_batch(K, sequences, width)
    args = V.Args(loss="ppo-clip", loss_type=loss_type, beta=beta, prompts_per_step=4, num_generations=2)
    args.forward_lag, args.micro_batch_size, args.max_new_tokens = K, micro, width
    accumulation = sequences // micro
    deviation = 0.0
    for k in range(K):
        ours_logp, theirs_logp = logp_all[k].clone().requires_grad_(), logp_all[k].clone().requires_grad_()
        scale = V.loss_scale(args, mask[k].sum().item(), mask.sum().item())
        ours, theirs = 0.0, 0.0
        for start in range(0, sequences, micro):
            rows = slice(start, start + micro)
            m = mask[k, rows]
            old = torch.where(m, behaviour[k, rows], ours_logp[rows].detach())  # as update() passes it
            a = advantages[k, rows][:, None].expand_as(m)
            ours = ours + V.micro_batch_loss(args, ours_logp[rows], old, reference[k, rows], a, m, False, scale)[0]
            inputs = {
                "prompt_ids": torch.zeros(micro, 1, dtype=torch.long),
                "prompt_mask": torch.ones(micro, 1, dtype=torch.long),
                "completion_ids": torch.zeros(micro, width, dtype=torch.long),
                "completion_mask": m.long(),
                "advantages": advantages[k, rows],
                "old_per_token_logps": behaviour[k, rows],
                "ref_per_token_logps": reference[k, rows],
                "num_items_in_batch": mask.sum(),  # the generation batch's completion tokens
            }
            fake = trl_trainer(loss_type, beta, theirs_logp[rows], accumulation, K * accumulation, width)
            theirs = theirs + GRPOTrainer._compute_loss(fake, None, inputs)
        ours.backward()
        theirs.backward()
        assert ours.item() == pytest.approx(theirs.item(), rel=1e-5, abs=1e-7)
        torch.testing.assert_close(ours_logp.grad, theirs_logp.grad, rtol=1e-5, atol=1e-8)
        deviation = max(deviation, abs(ours.item() - theirs.item()), (ours_logp.grad - theirs_logp.grad).abs().max().item())
    print(f"{loss_type} beta {beta}: max deviation from TRL {deviation:.1e}")


def test_minibatch_loss_type_is_trls_bnpo_with_one_micro_batch_and_differs_from_dapo():
    """Ours (`minibatch`) is bnpo where a step is one micro-batch; on ragged steps dapo's scale is the generation
    batch's mean step, not the step's own tokens: the two differ by N_k / (N / K), about 1 on average."""
    logp, behaviour, reference, advantages, mask = ragged_generation_batch()
    ratios = []
    for k in range(2):
        a = advantages[k][:, None].expand_as(mask[k])
        losses = {}
        for loss_type in ("minibatch", "bnpo", "dapo"):
            args = V.Args(loss="ppo-clip", loss_type=loss_type, prompts_per_step=4, num_generations=2, forward_lag=2)
            args.micro_batch_size = 8
            scale = V.loss_scale(args, mask[k].sum().item(), mask.sum().item())
            losses[loss_type] = V.micro_batch_loss(args, logp[k], behaviour[k], None, a, mask[k], False, scale)[0].item()
        assert losses["minibatch"] == pytest.approx(losses["bnpo"], rel=1e-6)
        ratios.append(losses["dapo"] / losses["minibatch"])
        assert ratios[-1] == pytest.approx(mask[k].sum().item() / (mask.sum().item() / 2), rel=1e-5)
    assert ratios[0] != pytest.approx(ratios[1], rel=1e-3)


def trl_advantages(rewards, num_generations, scale_rewards, nanstd):
    """TRL 1.16.0's advantages (grpo_trainer.py, _generate_and_score_completions, sum_then_normalize), its lines as
    they are, for one reward function of weight 1 and no unscorable completion."""
    mean_grouped_rewards = torch.nanmean(rewards.view(-1, num_generations), dim=1)
    mean_grouped_rewards = mean_grouped_rewards.repeat_interleave(num_generations, dim=0)
    if scale_rewards in ["group", "none"]:
        std_rewards = nanstd(rewards.view(-1, num_generations), dim=1)
        std_rewards = std_rewards.repeat_interleave(num_generations, dim=0)
    elif scale_rewards == "batch":
        std_rewards = nanstd(rewards).expand_as(rewards)
    advantages = rewards - mean_grouped_rewards
    if scale_rewards != "none":
        advantages = advantages / (std_rewards + 1e-4)
    return advantages


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_scale_rewards_equal_trls(scale):
    _, nanstd = trl()
    g = torch.Generator().manual_seed(1)
    rewards = torch.cat([torch.rand(24, generator=g), torch.ones(4), torch.zeros(4), (torch.rand(8, generator=g) > 0.5)])
    batch_std = V.sample_std(len(rewards), rewards.sum().item(), rewards.square().sum().item())
    ours, zero_std = V.grpo_advantages(rewards, 4, scale, batch_std)
    theirs = trl_advantages(rewards, 4, scale, nanstd)
    deviation = (ours - theirs).abs().max().item()
    print(f"scale_rewards {scale}: max deviation from TRL {deviation:.1e}")
    assert deviation < 1e-5 and zero_std == pytest.approx(2 / 10)
    # the logged batch std is TRL's reward_std, the std of all the batch's rewards: groups [1,1,1,1], [0,0,0,0]
    assert batch_std == pytest.approx(nanstd(rewards).item(), rel=1e-6)
    assert V.sample_std(8, 4.0, 4.0) == pytest.approx(nanstd(torch.tensor([1.0] * 4 + [0.0] * 4)).item())
    if scale == "batch":  # in one process, the std of the rewards it holds
        assert V.grpo_advantages(rewards, 4, "batch")[0].sub(ours).abs().max() < 1e-5


@pytest.mark.parametrize("kind", ["constant", "linear", "cosine"])
@pytest.mark.parametrize("warmup_ratio", [0.0, 0.25])
def test_learning_rate_schedule_equals_transformers(kind, warmup_ratio):
    import math

    from transformers import get_scheduler

    total = 20
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.Adam([parameter], lr=3e-4)
    name = "constant_with_warmup" if kind == "constant" else kind
    scheduler = get_scheduler(name, optimizer, num_warmup_steps=math.ceil(warmup_ratio * total), num_training_steps=total)
    args = V.Args(learning_rate=3e-4, lr_scheduler_type=kind, warmup_ratio=warmup_ratio)
    for step in range(total):
        assert V.learning_rate_at(args, step, total) == pytest.approx(optimizer.param_groups[0]["lr"], rel=1e-12, abs=1e-20)
        optimizer.step()
        scheduler.step()
    assert V.learning_rate_at(V.Args(learning_rate=3e-4), 7, total) == 3e-4  # the default: exactly the rate


# ---------------------------------------------------------------- the flags in short runs of the tiny model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny_trl")
    return {"llama": write_tiny_model(folder / "llama", "llama"), "data": write_gsm8k_jsonl(folder / "train.jsonl")}


def tiny_args(tiny, tmp_path, **overrides) -> V.Args:
    settings = dict(
        model_id=tiny["llama"],
        data_file=tiny["data"],
        run_dir=str(tmp_path / "run"),
        eval_every=0,
        num_iterations=1,
        prompts_per_step=4,
        num_generations=8,
        micro_batch_size=16,
        max_new_tokens=8,
        learning_rate=3e-3,
        torch_threads=1,
        overwrite=True,
    )
    settings.update(overrides)
    return V.Args(**settings)


@pytest.fixture
def toy_reward(monkeypatch):
    monkeypatch.setattr(V, "compute_reward", digit_fraction)


def test_loss_types_agree_where_every_completion_is_as_long(tiny, tmp_path, toy_reward, monkeypatch):
    """With no stop token every completion is --max-new-tokens long, so every micro-batch, step and completion holds
    as many tokens and the five normalisations give one loss; where lengths differ they do not."""
    monkeypatch.setattr(V, "stop_token_ids", lambda model, tokenizer: [10**6])
    losses = {}
    for loss_type in ("minibatch", "grpo", "bnpo", "dr_grpo", "dapo"):
        history = V.main(tiny_args(tiny, tmp_path, loss_type=loss_type, forward_lag=2, loss="ppo-clip"))
        losses[loss_type] = [s["policy_loss"] for s in history["steps"]]
    for loss_type, values in losses.items():
        assert values == pytest.approx(losses["minibatch"], rel=1e-5, abs=1e-6), loss_type  # step 1: 0 (r = 1) but rounding
    assert any(abs(v) > 1e-4 for v in losses["minibatch"])


def test_loss_types_differ_on_ragged_completions(tiny, tmp_path, toy_reward):
    losses = {}
    for loss_type in ("minibatch", "grpo", "dr_grpo", "dapo"):
        history = V.main(tiny_args(tiny, tmp_path, loss_type=loss_type, forward_lag=2, loss="ppo-clip"))
        assert history["iterations"][0]["response_length_min"] < history["iterations"][0]["response_length_max"]
        losses[loss_type] = history["steps"][1]["policy_loss"]
    assert len({round(v, 7) for v in losses.values()}) == 4, losses


@pytest.mark.parametrize("scale", ["batch", "none"])
def test_scale_rewards_runs_and_logs_trls_reward_std(tiny, tmp_path, monkeypatch, scale):
    seen = []

    def recording_reward(completion, reference):
        seen.append(digit_fraction(completion, reference))
        return seen[-1]

    monkeypatch.setattr(V, "compute_reward", recording_reward)
    history = V.main(tiny_args(tiny, tmp_path, scale_rewards=scale))
    rewards = torch.tensor(seen)
    record = history["iterations"][0]
    assert record["reward_std_batch"] == pytest.approx(rewards.std().item(), rel=1e-5)
    assert record["reward_std"] == pytest.approx(rewards.view(-1, 8).std(dim=1).mean().item(), rel=1e-5)
    assert history["steps"][0]["grad_norm"] > 0


def test_beta_adds_the_kl_to_the_frozen_initial_model(tiny, tmp_path, toy_reward):
    history = V.main(tiny_args(tiny, tmp_path, beta=0.5, forward_lag=2, num_iterations=2, lag=1, loss="vaco"))
    kl = [s["reference_kl"] for s in history["steps"]]
    assert kl[0] == 0.0 and all(value > 0 for value in kl[1:]), kl  # the first step is the reference's own policy
    assert "reference_kl" not in V.main(tiny_args(tiny, tmp_path))["steps"][0]
    # the KL pulls towards the reference: a strong beta keeps the policy nearer to it than a negligible one
    kl = {}
    for beta in (1e-6, 5.0):
        steps = V.main(tiny_args(tiny, tmp_path, forward_lag=2, num_iterations=3, learning_rate=1e-2, beta=beta))["steps"]
        kl[beta] = sum(s["reference_kl"] for s in steps[-2:])
    assert kl[5.0] < 0.5 * kl[1e-6], kl


def test_num_epochs_passes_over_each_generation_batch(tiny, tmp_path, toy_reward):
    history = V.main(tiny_args(tiny, tmp_path, num_epochs=3, forward_lag=2, num_iterations=2, loss="vaco"))
    steps = history["steps"]
    assert [(s["iteration"], s["epoch"], s["position"]) for s in steps[:6]] == [(1, e, k) for e in (1, 2, 3) for k in (1, 2)]
    assert len(steps) == 12 and steps[0]["tv"] == 0.0 and steps[2]["tv"] > 0.0  # minibatch 1 again: 2 updates old
    assert len(V.main(tiny_args(tiny, tmp_path, num_epochs=2, forward_lag=2, total_steps=8))["iterations"]) == 2


def test_learning_rate_schedule_in_a_run(tiny, tmp_path, toy_reward):
    args = tiny_args(tiny, tmp_path, lr_scheduler_type="cosine", warmup_ratio=0.25, forward_lag=2, num_iterations=4)
    steps = V.main(args)["steps"]
    assert [s["learning_rate"] for s in steps] == [V.learning_rate_at(args, n, 8) for n in range(8)]
    assert steps[0]["learning_rate"] == 0.0 and steps[2]["learning_rate"] == 3e-3 > steps[-1]["learning_rate"] > 0


def test_resume_keeps_a_schedules_length(tiny, tmp_path, toy_reward, capsys):
    args = tiny_args(tiny, tmp_path, lr_scheduler_type="linear", num_iterations=2)
    V.main(args)
    with pytest.raises(SystemExit):
        V.parse_args(
            [
                f"--{k.replace('_', '-')}={v}"
                for k, v in json.loads((tmp_path / "run" / "args.json").read_text()).items()
                if k not in ("resume", "overwrite", "num_iterations", "total_steps", "reward_weights", "system_prompt")
                and not isinstance(v, bool)
                and v is not None
            ]
            + ["--resume", "--no-overwrite", "--num-iterations", "3"]
        )
    assert "learning-rate schedule spans its steps" in capsys.readouterr().err


def test_reward_functions_weighted(tiny, tmp_path, monkeypatch):
    module = tmp_path / "my_rewards.py"
    module.write_text("def length(completions, **kwargs):\n    return [len(c) / 10 for c in completions]\n")
    monkeypatch.chdir(tmp_path)
    args = tiny_args(tiny, tmp_path, reward_funcs="correctness,format,my_rewards:length", reward_weights="1,0.5,2")
    record = V.main(args)["iterations"][0]
    means = [record[f"rewards/{name}/mean"] for name in ("correctness", "format", "my_rewards:length")]
    assert means[2] > 0 and record["reward"] == pytest.approx(means[0] + 0.5 * means[1] + 2 * means[2], rel=1e-6)
    assert V.format_reward(["so\n#### 12", "12"]) == [1.0, 0.0]
    for funcs, weights, fragment in [
        ("nothing", None, "neither correctness nor format nor module:function"),
        ("my_rewards:absent", None, "cannot import my_rewards:absent"),
        ("correctness,format", "1", "must be 2 finite numbers"),
        ("correctness", "x", "must be numbers separated by commas"),
        ("format,format", None, "names a function twice"),
    ]:
        with pytest.raises(ValueError, match=fragment):
            V.reward_functions(V.Args(reward_funcs=funcs, reward_weights=weights))


def test_lora_trains_adapters_only_saves_and_resumes_them(tiny, tmp_path, toy_reward, monkeypatch):
    import peft

    made = []

    def recording(model, args, original=V.trainable_policy):
        made.append(original(model, args))
        return made[-1]

    monkeypatch.setattr(V, "trainable_policy", recording)
    settings = dict(lora_r=4, learning_rate=3e-2, forward_lag=2, num_iterations=2, save_model=True, beta=0.1)
    history = V.main(tiny_args(tiny, tmp_path, **settings))
    model = made[-1][0]
    assert isinstance(model, peft.PeftModel) and made[-1][1] is None  # the reference: the adapters switched off
    assert history["steps"][0]["reference_kl"] == 0.0 < history["steps"][-1]["reference_kl"]
    base, _ = V.load_model_and_tokenizer(tiny["llama"])
    trained = dict(model.named_parameters())
    for name, weight in base.named_parameters():  # the base weights are untouched
        key = f"base_model.model.{name}"
        assert torch.equal(trained[key if key in trained else key.replace(".weight", ".base_layer.weight")], weight)
    adapters = [n for n, p in model.named_parameters() if p.requires_grad]
    assert adapters and all("lora_" in n for n in adapters)
    assert any(trained[n].abs().sum() > 0 for n in adapters if "lora_B" in n)  # B starts at 0: it moved
    assert (tmp_path / "run" / "model" / "adapter_model.safetensors").exists()
    assert not (tmp_path / "run" / "model" / "model.safetensors").exists()
    # a resumed run continues the adapters: two iterations then one more equal three at once
    V.main(tiny_args(tiny, tmp_path, **{**settings, "num_iterations": 1, "run_dir": str(tmp_path / "split")}))
    V.main(
        tiny_args(
            tiny,
            tmp_path,
            **{**settings, "num_iterations": 2, "run_dir": str(tmp_path / "split"), "resume": True, "overwrite": False},
        )
    )
    for name, value in made[-1][0].state_dict().items():
        assert torch.equal(value, model.state_dict()[name]), name


def test_memory_estimate_counts_activations(tiny):
    model, _ = V.load_model_and_tokenizer(tiny["llama"])
    line = V.memory_estimate(model, V.Args(micro_batch_size=16, max_new_tokens=24), 32, 126, False)
    config = model.config
    per_token = 8 * config.hidden_size + 4 * config.intermediate_size + 4 * config.num_key_value_heads * config.head_dim
    assert f"activations {4 * 16 * 150 * per_token * config.num_hidden_layers / 2**30:.2f} (16 x 150 tokens)" in line
    checkpointed = V.memory_estimate(
        model, V.Args(micro_batch_size=16, max_new_tokens=24, gradient_checkpointing=True), 32, 126, False
    )
    assert checkpointed != line


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--beta", "-1"], "--beta must be in [0, 100]"),
        (["--warmup-ratio", "2"], "--warmup-ratio must be in [0, 1]"),
        (["--num-epochs", "0"], "--num-epochs must be in [1, 2**31)"),
        (
            ["--total-steps", "6", "--num-epochs", "4"],
            "--total-steps (6) must be a multiple of --forward-lag x --num-epochs (4)",
        ),
        (["--loss-type", "sapo"], "--loss-type"),
        (["--scale-rewards", "std"], "--scale-rewards"),
        (["--lr-scheduler-type", "polynomial"], "--lr-scheduler-type"),
        (["--reward-funcs", "nothing"], "--reward-funcs: 'nothing' is neither correctness nor format nor module:function"),
        (["--reward-funcs", "correctness,format", "--reward-weights", "1"], "must be 2 finite numbers"),
        (["--reward-weights", "nan"], "must be 1 finite numbers"),
        (["--lora-r", "-1"], "--lora-r must be in [0, 65536]"),
        (["--lora-alpha", "0"], "--lora-alpha must be in (0, 65536]"),
    ],
)
def test_bad_new_flags_one_line_exit_2(tiny, tmp_path, capsys, argv, fragment):
    with pytest.raises(SystemExit) as stop:
        V.parse_args(["--model-id", tiny["llama"], "--run-dir", str(tmp_path / "run"), *argv])
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and err.startswith("error: ") and "\n" not in err and fragment in err, err
    assert not (tmp_path / "run").exists()


def test_lora_target_modules_that_are_not_there_one_line_and_nothing_left(tiny, tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        V.main(tiny_args(tiny, tmp_path, lora_r=2, lora_target_modules="no_such_proj"))
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and err.startswith("error: --lora-target-modules no_such_proj:") and "\n" not in err, err
    assert not (tmp_path / "run").exists()


def test_reference_only_with_beta_and_frozen(tiny):
    model, _ = V.load_model_and_tokenizer(tiny["llama"])
    assert V.trainable_policy(model, V.Args()) == (model, None)  # beta 0: no reference in memory
    same, reference = V.trainable_policy(model, V.Args(beta=0.1))
    assert same is model and reference is not model and not reference.training
    assert not any(p.requires_grad for p in reference.parameters())
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), reference.state_dict().values()))
