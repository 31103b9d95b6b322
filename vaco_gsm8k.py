"""GRPO on GSM8k with PPO-clip or VACO's filter, under forward and backward policy lag.

Reference implementation of the LLM experiment of "Align and Filter: Improving Performance in
Asynchronous On-Policy RL" (Honari, Creus Castanyer, Przystupa, Noukhovitch, Castro, Berseth;
arXiv 2603.01365, 2026). The specification is docs/method.md §4.

A causal LM answers grade-school maths questions; the reward is 1 when the completion's answer (the
last `####` line holding a number, else the last `\\boxed{}`, else the last number; markdown, `$`, `%`,
units and thousands commas tolerated, docs/method.md §4) equals the reference answer. Advantages
are GRPO's (G completions per prompt, group-normalised rewards, the same advantage on every token of
a completion). Policy lag:

- forward lag: one generation batch of K x 32 prompts is split into K optimizer steps
  (`--forward-lag K`), so step k trains on data that is k-1 updates old;
- backward lag: `--lag L` keeps the L+1 most recent policies and generates each batch with one
  drawn from them (docs/method.md §2).

Behaviour log-probs log beta are computed once per generation batch, by a teacher-forced pass with
the generating weights at the sampling temperature, and stay frozen (with no backward lag, the first
minibatch's come from its own training pass: same weights, same tensors, same values). Per-token ratio
r = pi_theta / beta. Losses (`--loss`):

- ppo-clip: -min(r A, clip(r, 1 - 0.2, 1 + 0.272) A) per token (asymmetric "clip-higher");
- vaco: D = 1/2 mean|r - 1| over the minibatch's completion tokens; when D > tv_threshold/2, tokens with
  A * sign(log pi_theta - log beta) > 0 are masked; loss -M r A per token, no clipping.

Token aggregation: both losses are summed over completion tokens and divided by the number of
completion tokens of the whole minibatch (all completions of its 32 prompts), so every token of a
minibatch weighs the same, whatever the length of its completion and however the minibatch is split
into micro-batches for gradient accumulation. With several micro-batches, VACO first scores the
minibatch in a no-grad pass so that every micro-batch applies the mask of the minibatch's D.

TRL's GRPOTrainer options (docs/gsm8k.md): its loss types (`--loss-type grpo|bnpo|dr_grpo|dapo`, the
aggregation above being `minibatch`), `--scale-rewards group|batch|none`, `--beta` times the k3 KL to the
frozen initial model, `--num-epochs` passes over each generation batch, a learning-rate schedule with warmup,
several weighted reward functions (`--reward-funcs`), LoRA through peft (`--lora-r`). Whatever they are, D and
the filter's mask are against beta.

Choices of ours (docs/method.md leaves them open): default model Qwen/Qwen2.5-0.5B-Instruct; prompt
wording; 400 new tokens at most; sampling at temperature 1 from the full distribution (no top-k /
top-p, so beta is exactly the softmax the tokens were drawn from); Adam with a constant learning
rate by default and gradient-norm clipping at 1.0; std with Bessel's correction and eps 1e-4 as TRL; dropout
disabled; fp32 logits under bf16 autocast; `--lag-mode fixed`.

Data parallel: under `torchrun --nproc-per-node N` each process generates and trains on 1/N of every
minibatch's prompts; the token count, D and the statistics are summed over processes and the
gradients summed, so the update is the single-process one. A run checkpoints to its folder and
continues with `--resume`; SIGINT and SIGTERM save what was asked and stop. The run folder holds only what a run
writes (run.json names the script and the run), is locked while a process uses it, and is written atomically.

Reading order: the algorithm, then `main`, then the run's plumbing. The algorithm: the method (GRPO's advantages,
the two losses, the log-probs); the loop (`iterate`) and one iteration's phases in the order it calls them
(`draw_generating_policy`, `generate_batch`, `rewards_and_advantages`, `behaviour_logprobs`, `update`,
`final_divergence`); the reward; generation and scoring; the flags (`Args`), what a run derives from them (`Setup`)
and its training state (`State`, what a checkpoint holds). `main` runs `start_run`, `iterate` and `finish`. The
plumbing: the flags' checks, the run folder, the checkpoint's format, the start (`claim_run_dir`, `start_run`,
`load_data_and_model`, `initial_state`, `restore_checkpoint`), signals and checkpoints (`save_checkpoint`), logging
(`log_iteration`), evaluation and the end (`evaluate`, `finish`).

Usage:
    python vaco_gsm8k.py --loss vaco --forward-lag 4
    python vaco_gsm8k.py --model-id /path/to/model --data-file train.jsonl --eval-data-file test.jsonl
    python vaco_gsm8k.py --model-id model.gguf --data-file problems.jsonl --eval-every 0 --log-completions-every 1
    torchrun --nproc-per-node 8 vaco_gsm8k.py --loss vaco --forward-lag 4 --run-dir runs/k4
    python vaco_gsm8k.py --loss vaco --forward-lag 4 --run-dir runs/k4 --resume
"""

import signal

# Ctrl-C while the libraries below load (seconds) ends the process quietly, not with a traceback from inside an import;
# iterate() installs the run's own handler once the run starts. Only as a script: an importer keeps its handler.
if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_DFL)

import collections
import contextlib
import copy
import dataclasses
import datetime
import errno
import fcntl
import hashlib
import importlib.util
import io
import itertools
import json
import math
import os
import random
import re
import shutil
import socket
import stat
import sys
import time
import typing
import urllib.parse
import uuid
import warnings
from dataclasses import dataclass
from typing import Literal, Optional

import huggingface_hub
import numpy as np
import torch
import transformers
import tyro
from huggingface_hub.errors import HFValidationError
from torch.utils.tensorboard import SummaryWriter
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

# Quiet logs: no download/loading/saving progress bars and no library warnings in the run's log.
transformers.utils.logging.disable_progress_bar()
transformers.utils.logging.set_verbosity_error()
huggingface_hub.utils.disable_progress_bars()

RUN_FORMAT = 1  # of run.json and of the checkpoint's header: a resume reads only its own format
SCRIPT = os.path.splitext(os.path.basename(__file__))[0]  # run.json's "script": whose run a folder holds

# ======================================================================================================================
# The method (docs/method.md §4): GRPO's advantages, the two policy losses, the log-probs they compare.
# ======================================================================================================================


ADV_EPS = 1e-4


def grpo_advantages(
    rewards: torch.Tensor, group_size: int, scale: str = "group", batch_std: Optional[float] = None
) -> tuple[torch.Tensor, float]:
    """A = (R - mean_group) / (std + 1e-4), one value per completion, as TRL's `scale_rewards`: std is the group's
    (`group`), `batch_std`, the std of all rewards of the generation batch (`batch`), or no division at all (`none`).

    `rewards` holds consecutive groups of `group_size` completions of the same prompt. The std has
    Bessel's correction, as TRL's GRPOTrainer. Also returns the fraction of groups whose rewards are
    all equal: their advantages are 0 and they carry no gradient.
    """
    grouped = rewards.view(-1, group_size)
    mean = grouped.mean(dim=1, keepdim=True)
    std = grouped.std(dim=1, keepdim=True)
    if scale == "group":
        advantages = (grouped - mean) / (std + ADV_EPS)
    elif scale == "batch":
        advantages = (grouped - mean) / ((rewards.std().item() if batch_std is None else batch_std) + ADV_EPS)
    else:
        advantages = grouped - mean
    return advantages.flatten(), (std == 0).float().mean().item()


def abs_deviation(log_ratio: torch.Tensor, mask: torch.Tensor) -> float:
    """sum |r - 1| over the tokens of `mask` ([B, C] both). D = 1/2 mean|r - 1|, the sample estimate of
    TV(pi_theta, beta) (docs/method.md §1), is half this sum over the minibatch's tokens (all micro-batches, all
    processes) divided by their number."""
    return (log_ratio.exp() - 1).abs()[mask].sum().item()


def ppo_clip_loss(
    logp: torch.Tensor, logp_behaviour: torch.Tensor, advantages: torch.Tensor, clip_low: float, clip_high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token PPO-clip with asymmetric clipping: -min(r A, clip(r, 1 - low, 1 + high) A).

    All arguments have one shape (per token: [B, C]). Returns the per-token loss and which tokens are
    clipped, i.e. have zero gradient (r > 1 + high with A > 0, or r < 1 - low with A < 0).
    """
    ratio = torch.exp(logp - logp_behaviour)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1 - clip_low, 1 + clip_high) * advantages
    is_clipped = ((ratio > 1 + clip_high) & (advantages > 0)) | ((ratio < 1 - clip_low) & (advantages < 0))
    return -torch.min(unclipped, clipped), is_clipped


def vaco_loss(
    logp: torch.Tensor, logp_behaviour: torch.Tensor, advantages: torch.Tensor, over_budget: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token VACO filter loss -M r A, no clipping (docs/method.md §3.4 and §4).

    When the minibatch is over budget (D > delta/2), a token keeps its gradient only if its step
    would not increase its TV contribution: M = [A * sign(log pi_theta - log beta) <= 0]. The sign is
    taken in log space. Returns the per-token loss and which tokens are masked.
    """
    log_ratio = logp - logp_behaviour
    ratio = torch.exp(log_ratio)
    if over_budget:
        masked = advantages * torch.sign(log_ratio.detach()) > 0
    else:
        masked = torch.zeros_like(advantages, dtype=torch.bool)
    return -torch.where(masked, torch.zeros_like(ratio), ratio * advantages), masked


def k3_kl(logp: torch.Tensor, logp_reference: torch.Tensor) -> torch.Tensor:
    """TRL's per-token estimate of KL(pi_theta || pi_ref) on tokens drawn from pi_theta: exp(d) - d - 1 with
    d = log pi_ref - log pi_theta (Schulman's k3: never negative, 0 where the two agree)."""
    delta = logp_reference - logp
    return torch.exp(delta) - delta - 1


def loss_scale(args: "Args", step_tokens: float, generation_tokens: float) -> float:
    """What `aggregate_loss` divides an optimizer step's per-token losses by, per --loss-type (TRL's GRPOTrainer with
    per_device_train_batch_size = --micro-batch-size, steps_per_generation = K optimizer steps, docs/method.md §6):
    minibatch, the step's completion tokens (ours); dapo, the generation batch's completion tokens / K; dr_grpo, the
    step's completions x --max-new-tokens; grpo, the step's completions; bnpo, the step's micro-batches (all ranks)."""
    completions = args.prompts_per_step * args.num_generations
    return {
        "minibatch": max(step_tokens, 1.0),
        "dapo": max(generation_tokens, 1.0) / args.forward_lag,
        "dr_grpo": float(completions * args.max_new_tokens),
        "grpo": float(completions),
        "bnpo": float(completions // args.micro_batch_size),
    }[args.loss_type]


def aggregate_loss(per_token: torch.Tensor, mask: torch.Tensor, loss_type: str, scale: float) -> torch.Tensor:
    """One micro-batch's share of its optimizer step's loss ([B, C] per-token losses, the loss mask): the sum over the
    mask divided by `loss_scale`, after a mean over each completion's tokens (grpo) or over the micro-batch's tokens
    (bnpo). Summed over the step's micro-batches (and ranks) this is the step's loss."""
    if loss_type == "grpo":
        return (torch.where(mask, per_token, 0.0).sum(-1) / mask.sum(-1).clamp(min=1)).sum() / scale
    total = per_token[mask].sum()
    return total / max(int(mask.sum()), 1) / scale if loss_type == "bnpo" else total / scale


def micro_batch_loss(args: "Args", logp, logp_behaviour, logp_reference, advantages, mask, over_budget: bool, scale: float):
    """A micro-batch's share of its optimizer step's loss (all [B, C]; `mask` the loss mask): --loss per token, plus
    --beta times the k3 KL to the reference (every token, the filtered ones too, as TRL adds it after its clip),
    aggregated by --loss-type. Returns the loss, the tokens the clip or the filter dropped, and the detached per-token
    KL (None at beta 0)."""
    if args.loss == "ppo-clip":
        per_token, dropped = ppo_clip_loss(logp, logp_behaviour, advantages, args.clip_low, args.clip_high)
    else:
        per_token, dropped = vaco_loss(logp, logp_behaviour, advantages, over_budget)
    kl = None
    if args.beta:
        kl = k3_kl(logp, torch.where(mask, logp_reference, logp.detach()))
        per_token = per_token + args.beta * kl
        kl = kl.detach()
    return aggregate_loss(per_token, mask, args.loss_type, scale), dropped, kl


def masked_completions(mask: torch.Tensor, dropped: torch.Tensor) -> tuple[int, int]:
    """Completions with at least one masked token, and completions with any token in the loss; `mask` is the
    [B, C] loss mask, `dropped` the [B, C] flags the losses return."""
    return int((dropped & mask).any(1).sum()), int(mask.any(1).sum())


def completion_logprobs(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    num_completion: int,
    temperature: float,
    with_entropy: bool = False,
):
    """log softmax(logits / temperature) of the tokens in the last `num_completion` columns, shape [B, C].

    Position ids follow the attention mask (left padding), exactly as `generate` builds them, so a
    teacher-forced pass scores the tokens with the positions they were generated at. Logits are kept
    for the completion positions only, and each row's log-probs are a gather minus a logsumexp, so
    no full-vocabulary log-softmax of the batch is materialised. With `with_entropy`, also returns
    the (detached) entropy of softmax(logits / temperature) at each completion position.
    """
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        logits_to_keep=num_completion + 1,
        use_cache=False,
    ).logits[:, :-1]
    targets = input_ids[:, -num_completion:]
    rows, entropies = [], []
    for row_logits, row_targets in zip(logits, targets):
        row_logits = row_logits.float() / temperature
        picked = row_logits.gather(-1, row_targets[:, None]).squeeze(-1)
        log_normaliser = torch.logsumexp(row_logits, dim=-1)
        rows.append(picked - log_normaliser)
        if with_entropy:
            with torch.no_grad():
                entropies.append(log_normaliser - (torch.softmax(row_logits, -1) * row_logits).sum(-1))
    if with_entropy:
        return torch.stack(rows), torch.stack(entropies)
    return torch.stack(rows)


# ======================================================================================================================
# The loop: the iterations, then one iteration's phases in the order iterate() calls them: draw the generating
# policy (backward lag), generate one batch of K minibatches (forward lag), rewards and advantages, behaviour
# log-probs, K optimizer steps, the final divergence. What they share is a Setup and a State (below).
# ======================================================================================================================


def iterate(setup: "Setup", state: "State") -> Optional[signal.Signals]:
    """The run's iterations, from the first one after the checkpoint; returns the signal that stopped them, if any."""
    args = setup.args
    previous_handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    stop = stop_on_signals()
    setup.start_time = time.time()
    try:
        if setup.eval_rows and setup.main_process and (not args.resume or setup.restart):
            print(evaluate(setup, state), flush=True)
        for iteration in range(state.first_iteration, setup.num_iterations + 1):
            setup.start_clock()
            # One generation batch of K minibatches, from a policy of the buffer (backward lag), with GRPO's
            # advantages and the generating policy's log-probs.
            staleness = draw_generating_policy(setup, state)
            generated, rows = generate_batch(setup, state)
            rollout, tokens = rewards_and_advantages(setup, generated, rows)
            size = setup.local_sequences
            minibatches = [take_rows(generated, slice(k * size, (k + 1) * size)) for k in range(args.forward_lag)]
            behaviour_logprobs(setup, state, minibatches)

            # mu x K optimizer steps, one per minibatch and epoch: minibatch k (from 0) of epoch e (from 0) trains on
            # data e K + k updates old (forward lag); log beta stays the generating policy's throughout.
            state.model.train()
            steps, tokens["trained"] = [], 0
            for epoch, (k, batch) in itertools.product(range(args.num_epochs), enumerate(minibatches)):
                step, trained = update(setup, state, iteration, epoch, k, batch, tokens["loss"])
                log_step(setup, state, step)
                steps.append(step)
                tokens["trained"] += trained
            final_tv = final_divergence(setup, state, minibatches)
            if args.lag:  # the updated policy joins the buffer
                with setup.timed("buffer"):
                    state.policy_buffer.append(snapshot(state.model))

            last, evaluation = iteration == setup.num_iterations, None
            if setup.main_process and setup.eval_rows and (iteration % args.eval_every == 0 or last):
                with setup.timed("eval"):
                    evaluation = evaluate(setup, state)
            log_iteration(setup, state, iteration, rollout, tokens, steps, staleness, final_tv)
            if evaluation:  # after the line of the iteration it evaluates
                print(evaluation, flush=True)
            log_completions(setup, state, iteration, generated)
            warn_if_no_signal(setup, state)
            stopping = setup.all_reduce([len(stop)], torch.distributed.ReduceOp.MAX)[0] > 0  # all ranks stop together
            if last or stopping or (args.checkpoint_every and iteration % args.checkpoint_every == 0):
                save_checkpoint(setup, state, iteration)
            if stopping:
                return signal.Signals(stop[0] if stop else signal.SIGTERM)
    except FloatingPointError as problem:
        if setup.writer:
            setup.writer.close()
        raise SystemExit(f"error: {problem}; stopping")
    finally:
        for sig, handler in previous_handlers.items():
            signal.signal(sig, handler)
    return None


def draw_generating_policy(setup: "Setup", state: "State") -> int:
    """Backward lag (docs/method.md §2): load one of the buffered policies into the generator, drawn with the data-order
    generator (the same draw on every rank). Returns its staleness, the updates it is behind the learner."""
    if not setup.args.lag:
        return 0
    index = 0 if setup.args.lag_mode == "fixed" else int(state.data_rng.integers(len(state.policy_buffer)))
    with setup.timed("buffer"):
        state.generator.load_state_dict(state.policy_buffer[index])
    return len(state.policy_buffer) - 1 - index


def generate_batch(setup: "Setup", state: "State") -> tuple[dict, list[tuple[str, float]]]:
    """One generation batch of K minibatches (forward lag): this rank's share of each minibatch's prompts, G completions
    each. Returns the batch (see `generate`) and the data row (question, reference answer) of each completion."""
    args, G = setup.args, setup.args.num_generations
    state.model.eval()
    with setup.timed("generation"):
        prompt_rows = []
        for _ in range(args.forward_lag):
            while len(state.order) < args.prompts_per_step:
                state.order.extend(state.data_rng.permutation(len(setup.train_rows)).tolist())
            indices = [state.order.popleft() for _ in range(args.prompts_per_step)]
            prompt_rows += indices[setup.rank * setup.local_prompts : (setup.rank + 1) * setup.local_prompts]
        prompts = [setup.train_prompts[i] for i in prompt_rows for _ in range(G)]
        with setup.autocast():
            generated = generate(
                state.generator,
                prompts,
                setup.sample_config,
                setup.stop_ids,
                setup.pad_id,
                setup.device,
                args.generation_batch_size,
            )
    return generated, [setup.train_rows[i] for i in prompt_rows for _ in range(G)]


def rewards_and_advantages(setup: "Setup", generated: dict, rows: list[tuple[str, float]]) -> tuple[dict, dict]:
    """Rewards (the weighted sum of the reward functions') and GRPO advantages; adds `advantages` and the `loss_mask`
    of the tokens that train to `generated`. Returns the batch's statistics for the iteration's record and its token
    counts (`sequences`: prompts and completions, `completions`, `loss`: the tokens of the loss mask), over all ranks."""
    args = setup.args
    with setup.timed("rewards"):
        texts = decode_completions(setup.tokenizer, generated)
        references = [reference for _, reference in rows]
        per_function = reward_table(setup.reward_functions, texts, rows)
        rewards = (per_function * torch.tensor([weight for _, _, weight in setup.reward_functions])).sum(1)
        batch_std = None
        if args.scale_rewards == "batch":  # the std of the whole generation batch's rewards, all ranks
            batch_std = sample_std(
                *setup.all_reduce([float(len(rewards)), rewards.sum().item(), rewards.square().sum().item()])
            )
        advantages, zero_std = grpo_advantages(rewards, args.num_generations, args.scale_rewards, batch_std)
        group_std = rewards.view(-1, args.num_generations).std(dim=1)
        lengths = generated["completion_mask"].sum(1).float().cpu()
        truncated = generated["truncated"].float().cpu()
        generated["loss_mask"] = generated["completion_mask"]
        if args.mask_truncated_completions:
            generated["loss_mask"] = generated["completion_mask"] & ~generated["truncated"][:, None]
        counts = {  # this rank's sums, added over ranks below
            "reward": rewards.sum().item(),
            "reward_squares": rewards.square().sum().item(),
            **{
                f"rewards/{name}/mean": column.sum().item()
                for (name, _, _), column in zip(setup.reward_functions, per_function.T)
            },
            "completions": float(len(texts)),
            "correct": sum(is_correct(t, r) for t, r in zip(texts, references)),
            "formatted": sum(extract_answer(t) is not None for t in texts),
            "completion_tokens": lengths.sum().item(),
            "truncated": truncated.sum().item(),
            "group_std": group_std.sum().item(),
            "zero_std_groups": zero_std * group_std.numel(),
            "groups": float(group_std.numel()),
            "tokens": generated["attention_mask"].sum().item(),
            "loss_tokens": generated["loss_mask"].sum().item(),
        }
        total = dict(zip(counts, setup.all_reduce(list(counts.values()))))
        (shortest,) = setup.all_reduce([lengths.min().item()], torch.distributed.ReduceOp.MIN)
        (longest,) = setup.all_reduce([lengths.max().item()], torch.distributed.ReduceOp.MAX)
        generated["rewards"], generated["advantages"] = rewards, advantages.to(setup.device)
    rollout = {
        "reward": total["reward"] / total["completions"],
        "reward_std": total["group_std"] / total["groups"],
        "reward_std_batch": sample_std(total["completions"], total["reward"], total["reward_squares"]),
        **{key: total[key] / total["completions"] for key in counts if key.startswith("rewards/")},
        "accuracy": total["correct"] / total["completions"],
        "format_rate": total["formatted"] / total["completions"],
        "response_length": total["completion_tokens"] / total["completions"],
        "response_length_min": shortest,
        "response_length_max": longest,
        "truncated_fraction": total["truncated"] / total["completions"],
        "zero_std_fraction": total["zero_std_groups"] / total["groups"],
    }
    tokens = {"sequences": total["tokens"], "completions": total["completion_tokens"], "loss": total["loss_tokens"]}
    return rollout, tokens


def behaviour_logprobs(setup: "Setup", state: "State", minibatches: list[dict]):
    """log beta of every minibatch from the generating weights, frozen from here on. With no backward lag the first
    minibatch is scored by unchanged weights in its own training pass, the same tensors and the same computation as a
    separate pass would be (r = 1 exactly): that pass is skipped (`update` fills it in). With --beta, also the frozen
    reference policy's log-probs (the initial model; with LoRA, the model with its adapters off)."""
    args = setup.args
    with setup.timed("behaviour"):
        for k, batch in enumerate(minibatches):
            if k == 0 and not args.lag:
                batch["logp_behaviour"] = None
            else:
                batch["logp_behaviour"] = score(
                    state.generator, batch, args.micro_batch_size, args.temperature, setup.autocast
                )
    if args.beta:
        with setup.timed("reference"), state.model.disable_adapter() if state.reference is None else contextlib.nullcontext():
            for batch in minibatches:
                reference = state.reference or state.model
                batch["logp_reference"] = score(reference, batch, args.micro_batch_size, args.temperature, setup.autocast)


def is_over_budget(setup: "Setup", deviation: float, denominator: float) -> bool:
    """VACO's test D > delta/2, D = 1/2 sum|r - 1| / tokens over the whole minibatch (all ranks)."""
    return 0.5 * setup.all_reduce([deviation])[0] / denominator > setup.args.tv_threshold / 2


def prescore_over_budget(setup: "Setup", state: "State", batch: dict, denominator: float) -> Optional[bool]:
    """VACO's D > delta/2 for the minibatch, before its update. D is the whole minibatch's (all ranks) but gradients
    accumulate by micro-batch: a no-grad pass scores it first, so all apply one mask; with one micro-batch per rank
    the training pass decides (None). r = 1 when log beta is the training pass's (`behaviour_logprobs`): False."""
    args = setup.args
    if args.loss != "vaco" or batch["logp_behaviour"] is None:
        return False
    if setup.single_pass:
        return None
    with setup.timed("prescore"):
        current = score(state.model, batch, args.micro_batch_size, args.temperature, setup.autocast)
        deviation = abs_deviation(current - batch["logp_behaviour"], batch["loss_mask"])
    return is_over_budget(setup, deviation, denominator)


def update(
    setup: "Setup", state: "State", iteration: int, epoch: int, k: int, batch: dict, generation_tokens: float
) -> tuple[dict, int]:
    """The optimizer step on minibatch k of the generation batch in its epoch (forward lag epoch K + k): PPO-clip or
    VACO's filter (D and the mask against beta, whatever --loss-type and --beta), plus --beta times the k3 KL to the
    reference on every token, aggregated by --loss-type, the gradient accumulated micro-batch by micro-batch. Per-token
    tensors are [B, C] with the loss mask, as TRL's. Returns the step's record and the tokens this rank trained on."""
    args, model = setup.args, state.model
    num_tokens = setup.all_reduce([batch["loss_mask"].sum().item()])[0]
    denominator = max(num_tokens, 1.0)  # the token mean of D and of the logged statistics, whatever --loss-type
    scale = loss_scale(args, num_tokens, generation_tokens)
    over_budget = prescore_over_budget(setup, state, batch, denominator)
    # With no backward lag, minibatch 0's log beta is this pass's log pi_theta (`behaviour_logprobs` skipped it).
    own_behaviour = batch["logp_behaviour"] is None
    behaviour_rows, training_tokens = [], 0
    with setup.timed("training"):
        state.optimizer.zero_grad(set_to_none=True)
        sums = collections.Counter()
        for rows, ids, mask, completion_mask in micro_batches(batch, args.micro_batch_size):
            width = completion_mask.shape[1]
            with setup.autocast():
                logp, entropy = completion_logprobs(model, ids, mask, width, args.temperature, True)
            loss_mask = batch["loss_mask"][rows, :width]
            if own_behaviour:
                behaviour_rows.append((rows, logp.detach().float() * completion_mask))
                logp_behaviour = logp.detach()
            else:
                logp_behaviour = batch["logp_behaviour"][rows, :width]
            # r = 1 off the mask (padding, masked truncations), where log beta is not a generated token's.
            logp_behaviour = torch.where(loss_mask, logp_behaviour, logp.detach())
            advantages = batch["advantages"][rows][:, None].expand_as(loss_mask)
            log_ratio = logp.detach() - logp_behaviour
            if over_budget is None:
                over_budget = is_over_budget(setup, abs_deviation(log_ratio, loss_mask), denominator)
            logp_reference = batch["logp_reference"][rows, :width] if args.beta else None
            loss, dropped, kl = micro_batch_loss(
                args, logp, logp_behaviour, logp_reference, advantages, loss_mask, over_budget, scale
            )
            if not torch.isfinite(loss):
                raise FloatingPointError(f"non-finite loss at iteration {iteration}, minibatch {k + 1}")
            loss.backward()
            sums["loss"] += loss.item()
            if kl is not None:
                sums["reference_kl"] += kl[loss_mask].sum().item()
            sums.update(token_statistics(args, log_ratio, dropped, advantages, entropy, loss_mask))
            training_tokens += int(mask.sum())
        sum_gradients(setup, state)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm))
        if not math.isfinite(grad_norm):
            raise FloatingPointError(f"non-finite gradient at iteration {iteration}, minibatch {k + 1}")
        for group in state.optimizer.param_groups:
            group["lr"] = learning_rate_at(
                args, state.counters["global_step"], setup.num_iterations * setup.steps_per_iteration
            )
        state.optimizer.step()
    if own_behaviour:  # frozen from here on, for the final divergence
        batch["logp_behaviour"] = torch.zeros_like(batch["loss_mask"], dtype=torch.float32)
        for rows, logp_behaviour in behaviour_rows:
            batch["logp_behaviour"][rows, : logp_behaviour.shape[1]] = logp_behaviour
    state.counters["global_step"] += 1
    return step_record(setup, state, iteration, epoch, k, sums, denominator, grad_norm, bool(over_budget)), training_tokens


def final_divergence(setup: "Setup", state: "State", minibatches: list[dict]) -> Optional[float]:
    """D of the generation batch after its last update (the paper's TV plot), on the first --final-tv-fraction of
    each minibatch's micro-batches; None with --final-tv-fraction 0."""
    if not setup.final_tv_batches:
        return None
    args = setup.args
    state.model.eval()
    with setup.timed("final_tv"):
        deviation, count = 0.0, 0.0
        for batch in minibatches:
            current = score(
                state.model, batch, args.micro_batch_size, args.temperature, setup.autocast, setup.final_tv_batches
            )
            scored = batch["loss_mask"].clone()
            scored[setup.final_tv_batches * args.micro_batch_size :] = False
            deviation += abs_deviation(current - batch["logp_behaviour"], scored)
            count += scored.sum().item()
        deviation, count = setup.all_reduce([deviation, count])
    return 0.5 * deviation / max(count, 1.0)


def sum_gradients(setup: "Setup", state: "State"):
    """Under torchrun, the sum of the gradients over ranks: each rank's loss is already divided by the global count."""
    if not setup.distributed:
        return
    for parameter in state.model.parameters():
        if parameter.grad is None:
            parameter.grad = torch.zeros_like(parameter)
    handles = [torch.distributed.all_reduce(p.grad, async_op=True) for p in state.model.parameters()]
    for handle in handles:
        handle.wait()


def snapshot(model) -> dict:
    """The weights, copied to host memory: an entry of the policy buffer. Tied weights (an output head that is the
    input embedding) stay one tensor, held and checkpointed once."""
    copies = {}
    for value in model.state_dict().values():
        if value.data_ptr() not in copies:
            copies[value.data_ptr()] = value.detach().to("cpu", copy=True)
    return {key: copies[value.data_ptr()] for key, value in model.state_dict().items()}


def sample_std(count: float, total: float, squares: float) -> float:
    """The std with Bessel's correction of `count` values from their sum and sum of squares (all ranks' sums)."""
    return math.sqrt(max(squares - total * total / count, 0.0) / max(count - 1, 1.0))


def token_statistics(args: "Args", log_ratio, dropped, advantages, entropy, mask) -> dict:
    """One micro-batch's sums over the tokens of `mask` (all [B, C]), for `step_record`."""
    ratio = log_ratio.exp()
    sums = {
        "abs_dev": abs_deviation(log_ratio, mask),
        "approx_kl": ((ratio - 1) - log_ratio)[mask].sum().item(),
        "dropped": dropped[mask].sum().item(),
        "clip_low": ((ratio < 1 - args.clip_low) & (advantages < 0))[mask].sum().item(),
        "clip_high": ((ratio > 1 + args.clip_high) & (advantages > 0))[mask].sum().item(),
        "entropy": entropy[mask].sum().item(),
    }
    if args.loss == "vaco":
        sums["dropped_completions"], sums["completions"] = masked_completions(mask, dropped)
    return sums


def learning_rate_at(args: "Args", step: int, total: int) -> float:
    """The learning rate of the optimizer step after `step` steps of the run's `total`: a linear warmup from 0 over the
    first ceil(--warmup-ratio x total) steps, then constant, linear to 0 or half a cosine to 0, as transformers'
    get_scheduler (TRL's lr_scheduler_type, warmup_ratio)."""
    warmup = math.ceil(args.warmup_ratio * total)
    if step < warmup:
        return args.learning_rate * (step / max(1, warmup))
    progress = (step - warmup) / max(1, total - warmup)
    factor = {"constant": 1.0, "linear": 1.0 - progress, "cosine": 0.5 * (1.0 + math.cos(math.pi * progress))}
    return args.learning_rate * max(0.0, factor[args.lr_scheduler_type])


def step_record(
    setup: "Setup",
    state: "State",
    iteration: int,
    epoch: int,
    k: int,
    sums,
    denominator: float,
    grad_norm: float,
    over_budget: bool,
):
    """The optimizer step's statistics from its micro-batches' sums (all ranks), per token of the minibatch."""
    keys = ["loss", "abs_dev", "approx_kl", "dropped", "clip_low", "clip_high", "entropy", "dropped_completions"]
    keys += ["completions", "reference_kl"]
    totals = dict(zip(keys, setup.all_reduce([float(sums[key]) for key in keys])))
    step = {
        "step": state.counters["global_step"],
        "iteration": iteration,
        "epoch": epoch + 1,
        "position": k + 1,
        "policy_loss": totals["loss"],
        "tv": 0.5 * totals["abs_dev"] / denominator,
        "approx_kl": totals["approx_kl"] / denominator,
        "grad_norm": grad_norm,
        "entropy": totals["entropy"] / denominator,
        "learning_rate": state.optimizer.param_groups[0]["lr"],
    }
    if setup.args.beta:
        step["reference_kl"] = totals["reference_kl"] / denominator
    if setup.args.loss == "ppo-clip":
        step["clip_fraction"] = totals["dropped"] / denominator
        step["clip_ratio_low"] = totals["clip_low"] / denominator
        step["clip_ratio_high"] = totals["clip_high"] / denominator
    else:
        step["filter_fraction"] = totals["dropped"] / denominator
        step["filter_completion_fraction"] = totals["dropped_completions"] / max(totals["completions"], 1.0)
        step["over_budget"] = float(over_budget)
    return step


# ======================================================================================================================
# The reward (docs/method.md §4.1): the answer a completion gives, against the reference.
# ======================================================================================================================


# Answer parsing (docs/method.md §4): a number is digits with an optional decimal part, not glued to a
# letter, digit or a further decimal/fraction part (`1e5`, `3.5.2`, `1_000`, `3/4` are not numbers).
NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?![\w]|[.,/]\d)"


LEADING_NUMBER_RE = re.compile(rf"\s*:?\s*({NUMBER})")


ANY_NUMBER_RE = re.compile(rf"(?<![\w.,/]){NUMBER}")  # not the tail of `3/4` or `3,5` either


THOUSANDS_RE = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


DECORATION_RE = re.compile(r"\\boxed\{|\\text\{|\\[()\[\]]|\\\$|\*\*|__|[*`${}]")


LABEL_RE = re.compile(r"^\s*(?:the\s+)?(?:final\s+)?answer\s*(?:is\b|:)?\s*:?", re.IGNORECASE)


BOXED_RE = re.compile(r"\\boxed\{([^{}]*)\}")


def read_number(text: str) -> Optional[float]:
    """The number that starts `text` once markdown/LaTeX decoration and an "answer:" label are removed.

    `**18**`, `$18`, `\boxed{18}`, `18%`, `18 apples`, `1,000`, `-5`, `3.50`, `18.` all read as numbers;
    text after the last `=` is read when there is one (`#### 3 + 4 = 7` is 7); a leading word
    (`Step 1`) is not a number.
    """
    text = DECORATION_RE.sub("", THOUSANDS_RE.sub("", text.replace("\u2212", "-")))
    text = LABEL_RE.sub("", text.rpartition("=")[2])
    match = LEADING_NUMBER_RE.match(text)
    return float(match.group(1)) if match else None


def extract_answer(completion: str) -> Optional[float]:
    """The strict format: the number of the last `####` line that holds one (docs/method.md §4).

    Markdown headings such as `#### Step 1` before the final line are skipped, since they hold no
    number once their leading word is seen; with several `####` answers the last one counts.
    """
    for tail in reversed(completion.split("####")[1:]):
        number = read_number(tail.split("\n", 1)[0])
        if number is not None:
            return number
    return None


def final_answer(completion: str) -> Optional[float]:
    """The graded answer: the `####` answer, else the last `\boxed{}`, else the last number of the text."""
    number = extract_answer(completion)
    if number is not None:
        return number
    for boxed in reversed(BOXED_RE.findall(completion)):
        number = read_number(boxed)
        if number is not None:
            return number
    numbers = ANY_NUMBER_RE.findall(THOUSANDS_RE.sub("", completion.replace("\u2212", "-")))
    return float(numbers[-1]) if numbers else None


def reference_answer(answer: str) -> Optional[float]:
    """GSM8k's reference: the number after the last `####` of the `answer` field."""
    _, sep, tail = answer.rpartition("####")
    return read_number(tail) if sep else None


def is_correct(completion: str, reference: float) -> bool:
    predicted = final_answer(completion)
    return predicted is not None and math.isclose(predicted, reference, rel_tol=0.0, abs_tol=1e-6)


def compute_reward(completion: str, reference: float) -> float:
    """Verifiable reward (docs/method.md §4). Module level so a test can swap in another reward."""
    return float(is_correct(completion, reference))


# Reward functions (--reward-funcs) are called as TRL's are, by keyword, once per generation batch: the completions'
# texts, and for each its reference answer (a number) and its question; they return one number per completion.
def correctness_reward(completions: list[str], references: list[float], **kwargs) -> list[float]:
    """The GSM8k grader's reward, 1 for a right answer (`compute_reward`)."""
    return [compute_reward(completion, reference) for completion, reference in zip(completions, references)]


def format_reward(completions: list[str], **kwargs) -> list[float]:
    """1 for a completion that ends its answer in the `#### <number>` form the instruction asks for (format_rate)."""
    return [float(extract_answer(completion) is not None) for completion in completions]


BUILT_IN_REWARDS = {"correctness": correctness_reward, "format": format_reward}


def resolve_reward(name: str):
    """A built-in reward function by name, or a user's by import path `module:function` (the module imported from
    the current folder or the Python path); ValueError saying why not."""
    if name in BUILT_IN_REWARDS:
        return BUILT_IN_REWARDS[name]
    module_name, colon, function_name = name.partition(":")
    if not colon or not module_name or not function_name:
        raise ValueError(f"--reward-funcs: {name!r} is neither {' nor '.join(BUILT_IN_REWARDS)} nor module:function")
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        function = getattr(importlib.import_module(module_name), function_name)
    except Exception as error:  # ImportError, AttributeError, or the module's own failure on import
        raise ValueError(f"--reward-funcs: cannot import {name} ({type(error).__name__}: {error})")
    if not callable(function):
        raise ValueError(f"--reward-funcs: {name} is not a function")
    return function


def reward_functions(args: "Args") -> list[tuple[str, typing.Callable, float]]:
    """(name, function, weight) of each --reward-funcs entry, its weight from --reward-weights (1 when not given)."""
    names = [name.strip() for name in args.reward_funcs.split(",")]
    try:
        weights = [float(w) for w in args.reward_weights.split(",")] if args.reward_weights is not None else [1.0] * len(names)
    except ValueError:
        raise ValueError(f"--reward-weights must be numbers separated by commas, got {args.reward_weights!r}")
    if len(weights) != len(names) or not all(math.isfinite(w) for w in weights):
        raise ValueError(f"--reward-weights must be {len(names)} finite numbers, one per reward function, got {weights}")
    if len(set(names)) != len(names):
        raise ValueError(f"--reward-funcs names a function twice: {args.reward_funcs}")
    return [(name, resolve_reward(name), weight) for name, weight in zip(names, weights)]


def reward_table(functions, completions: list[str], rows: list[tuple[str, float]]) -> torch.Tensor:
    """[completions, functions] float32: each reward function's value for each completion."""
    references, questions = [reference for _, reference in rows], [question for question, _ in rows]
    columns = []
    for name, function, _ in functions:
        values = list(function(completions=completions, references=references, questions=questions))
        if len(values) != len(completions):
            raise SystemExit(f"error: reward function {name} returned {len(values)} values for {len(completions)} completions")
        columns.append([float(value) for value in values])
    return torch.tensor(columns, dtype=torch.float32).T


# ======================================================================================================================
# Generation and scoring: the completions of a batch of prompts, and their log-probs under a model.
# ======================================================================================================================


def left_pad(sequences: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, sequence in enumerate(sequences):
        ids[row, width - len(sequence) :] = torch.tensor(sequence, dtype=torch.long)
        mask[row, width - len(sequence) :] = 1
    return ids, mask


@torch.no_grad()
def generate(model, prompts: list[list[int]], config: GenerationConfig, stop_ids: list[int], pad_id: int, device, chunk=0):
    """Completions for left-padded prompts: dict of input_ids / attention_mask [B, P + C] and completion_mask [B, C].

    `chunk` sequences per `generate` call (0: all in one call). A completion runs up to and including
    its first stop token; later columns are padding. `truncated` marks completions with no stop token,
    cut at `max_new_tokens`.
    """
    prompt_ids, prompt_mask = left_pad(prompts, pad_id)
    prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device)
    chunk = chunk or len(prompts)
    pieces = [
        model.generate(
            input_ids=prompt_ids[i : i + chunk], attention_mask=prompt_mask[i : i + chunk], generation_config=config
        )
        for i in range(0, len(prompts), chunk)
    ]
    width = max(piece.shape[1] for piece in pieces)
    output = torch.cat([torch.nn.functional.pad(piece, (0, width - piece.shape[1]), value=pad_id) for piece in pieces])
    return completion_batch(prompt_ids, prompt_mask, output[:, prompt_ids.shape[1] :], stop_ids, pad_id)


def completion_batch(prompt_ids, prompt_mask, completion, stop_ids: list[int], pad_id: int) -> dict:
    """The batch dict of left-padded prompts and their sampled completions (see `generate`)."""
    is_stop = torch.isin(completion, torch.tensor(stop_ids, device=completion.device))
    completion_mask = (is_stop.long().cumsum(-1) - is_stop.long()) == 0
    completion = completion.masked_fill(~completion_mask, pad_id)
    return {
        "input_ids": torch.cat([prompt_ids, completion], dim=1),
        "attention_mask": torch.cat([prompt_mask, completion_mask.long()], dim=1),
        "completion_mask": completion_mask,
        "truncated": ~is_stop.any(-1),
    }


def take_rows(batch: dict, rows: slice) -> dict:
    return {key: value[rows] for key, value in batch.items()}


def micro_batches(batch: dict, size: int):
    """Consecutive slices of `size` sequences, trimmed of columns that are padding in every row.

    The behaviour, training and final-TV passes all score the same slices, so with no lag the
    training pass sees exactly the tensors the behaviour pass saw and r = 1 exactly.
    """
    num_completion = batch["completion_mask"].shape[1]
    for start in range(0, batch["input_ids"].shape[0], size):
        ids = batch["input_ids"][start : start + size]
        mask = batch["attention_mask"][start : start + size]
        completion_mask = batch["completion_mask"][start : start + size]
        first = int(mask.any(0).nonzero()[0])
        keep = num_completion - int(completion_mask.any(0).flip(0).long().argmax())  # last used column + 1
        end = ids.shape[1] - num_completion + keep
        yield slice(start, start + size), ids[:, first:end], mask[:, first:end], completion_mask[:, :keep]


def score(model, batch: dict, micro_batch_size: int, temperature: float, autocast, limit=None) -> torch.Tensor:
    """No-grad log-probs of the completion tokens, [B, C] with 0 on padding; only the first `limit` micro-batches."""
    out = torch.zeros(batch["completion_mask"].shape, dtype=torch.float32, device=batch["input_ids"].device)
    with torch.no_grad(), autocast():
        for n, (rows, ids, mask, completion_mask) in enumerate(micro_batches(batch, micro_batch_size)):
            if limit is not None and n >= limit:
                break
            logp = completion_logprobs(model, ids, mask, completion_mask.shape[1], temperature)
            out[rows, : completion_mask.shape[1]] = logp.float() * completion_mask
    return out


def decode_completions(tokenizer, batch: dict) -> list[str]:
    num_completion = batch["completion_mask"].shape[1]
    return tokenizer.batch_decode(batch["input_ids"][:, -num_completion:].tolist(), skip_special_tokens=True)


# ======================================================================================================================
# The command line's flags (their checks are in the plumbing), what a run derives from them (Setup) and the
# training state that the iterations move on and a checkpoint holds (State); then main, which runs the phases.
# ======================================================================================================================


GSM8K_ID = "openai/gsm8k"


INSTRUCTION = "Solve the problem step by step. End with the final answer on its own line, in the form '#### <number>'."


@dataclass
class Args:
    # Model and data
    model_id: str = "Qwen/Qwen2.5-0.5B-Instruct"
    """Hugging Face hub id, local save_pretrained folder, or local .gguf file (or a folder holding one) of a causal LM
    (the paper's model is not public; ours)"""
    data_file: Optional[str] = None
    """training prompts as JSONL with `question` and `answer` ending in `#### N` (None: openai/gsm8k train split)"""
    eval_data_file: Optional[str] = None
    """evaluation prompts, same schema (None: openai/gsm8k test split)"""
    max_new_tokens: int = 400
    """the most tokens generated per completion, at most 131072 (ours)"""
    temperature: float = 1.0
    """sampling temperature in [0.01, 10] (below, sampling is greedy in all but name; above, close to uniform over the
    vocabulary); behaviour and policy log-probs use the same temperature"""
    bf16: bool = True
    """bf16 autocast on CUDA (weights stay fp32); CPU always runs fp32"""
    gradient_checkpointing: bool = False
    """if toggled, recompute activations in the backward pass to save memory"""
    lora_r: int = 0
    """LoRA rank through peft (TRL's peft_config): only the adapters train, the base weights stay frozen and
    --save-model writes the adapters alone (0: no LoRA, every weight trains)"""
    lora_alpha: float = 32.0
    """LoRA's scale numerator: the adapters' update is scaled by lora_alpha / lora_r"""
    lora_target_modules: str = "all-linear"
    """the modules that get adapters: peft's `all-linear` (every linear layer but the output head) or names separated
    by commas (`q_proj,v_proj`)"""

    # Algorithm
    loss: Literal["ppo-clip", "vaco"] = "vaco"
    """policy loss: PPO-clip with clip-higher, or VACO's TV filter"""
    num_iterations: int = 100
    """number of generation batches (iterations)"""
    total_steps: Optional[int] = None
    """optimizer steps in the run: replaces --num-iterations by total-steps / (forward-lag x num-epochs), so runs at
    different K take the same steps on the same number of samples (None: --num-iterations decides)"""
    forward_lag: int = 1
    """K: optimizer steps per generation batch (the generation batch holds K x prompts-per-step prompts)"""
    prompts_per_step: int = 32
    """prompts per minibatch, i.e. per optimizer step (paper: 32)"""
    num_generations: int = 8
    """G: completions per prompt (paper: 8)"""
    micro_batch_size: int = 16
    """sequences per forward/backward pass (gradient accumulation); must divide prompts-per-step x G"""
    learning_rate: float = 1e-6
    """Adam learning rate, in [1e-10, 1] (paper: 1e-6; Adam moves each weight by about the rate, and below 1e-10 that is
    under float32's resolution of the weights: nothing would train); the peak of --lr-scheduler-type's schedule"""
    lr_scheduler_type: Literal["constant", "linear", "cosine"] = "constant"
    """the learning rate after warmup: constant (paper), linear to 0 or half a cosine to 0 at the run's last step"""
    warmup_ratio: float = 0.0
    """share of the run's optimizer steps over which the learning rate rises linearly from 0, in [0, 1]"""
    max_grad_norm: float = 1.0
    """the maximum norm for the gradient clipping, in [1e-6, 1e6] (ours)"""
    lag: int = 0
    """backward lag: generate with one of the lag+1 most recent policies (0: synchronous)"""
    lag_mode: Literal["uniform", "fixed"] = "uniform"
    """which buffered policy generates: uniform draw, or always the oldest (ours)"""
    clip_low: float = 0.2
    """PPO-clip lower ratio: r is clipped below at 1 - clip_low, in [1e-4, 1) (paper: 0.2; a narrower clip would act
    on the rounding noise of r)"""
    clip_high: float = 0.272
    """PPO-clip higher ratio: r is clipped above at 1 + clip_high, in [1e-4, 100] (paper: 0.272; above 100 it never
    acts)"""
    tv_threshold: float = 0.05
    """VACO's TV threshold delta in [1e-6, 2]: the filter acts when D > delta/2 (paper: 0.05). D estimates a total
    variation distance, at most 1, so delta = 2 filters only on sampling noise; below 1e-6, delta/2 is under
    float32's resolution of r - 1 and every step filters"""
    loss_type: Literal["minibatch", "grpo", "bnpo", "dr_grpo", "dapo"] = "minibatch"
    """how an optimizer step's per-token losses are summed and normalised: minibatch (ours) divides their sum by the
    minibatch's completion tokens; grpo, bnpo, dr_grpo and dapo are TRL's loss_type of the same name
    (docs/method.md §6). The filter's D is the minibatch's token mean whatever the loss type"""
    scale_rewards: Literal["group", "batch", "none"] = "group"
    """GRPO's advantage R - mean_group is divided by the group's reward std (paper), by the std of all the generation
    batch's rewards, or by nothing (TRL's scale_rewards)"""
    beta: float = 0.0
    """weight in [0, 100] of the k3 KL estimate to a frozen reference policy (the initial model; with LoRA the model
    with its adapters off), added to every token's loss (TRL's beta; 0: no reference is loaded or scored)"""
    num_epochs: int = 1
    """mu: passes over each generation batch's K minibatches, mu x K optimizer steps per generation batch (TRL's
    num_iterations); beta stays the generating policy's throughout"""
    reward_funcs: str = "correctness"
    """reward functions separated by commas, summed with --reward-weights: `correctness` (the GSM8k grader),
    `format` (1 for a `#### <number>` answer line), or a function of the user's as `module:function`, called with
    the keyword arguments completions, references and questions (lists) and returning one number per completion"""
    reward_weights: Optional[str] = None
    """the weights of --reward-funcs separated by commas, one each (None: 1 each)"""
    mask_truncated_completions: bool = False
    """if toggled, completions cut at --max-new-tokens (no stop token) get no gradient and do not count in the
    token denominator or D (their rewards still enter the group's advantages, as TRL's option of the same name)"""
    generation_batch_size: int = 0
    """sequences per `generate` call (0: the whole generation batch, K x prompts-per-step x G / processes, in one call)"""
    final_tv_fraction: float = 1.0
    """share of each minibatch's micro-batches scored after the update for lag/final_tv (0: skip that pass)"""
    tf32: bool = False
    """if toggled, allow TF32 for fp32 matmuls on CUDA: under --bf16 only the output head is fp32, kept in full
    precision on purpose (see keep_output_head_fp32); useful with --no-bf16"""
    eval_every: int = 10
    """greedy evaluation every this many iterations, plus before training and at the end (0: never)"""
    eval_size: int = 256
    """number of evaluation prompts (the first ones of the evaluation set)"""
    log_completions_every: int = 10
    """at the first iteration and every this many, a sample of the generation batch (prompt, completion, reward,
    advantage) goes to TensorBoard (text `completions`) and wandb (table `completions`), as TRL's log_completions
    (0: never)"""
    num_completions_to_log: int = 8
    """completions in that sample: the first ones of the generation batch, so whole groups of G"""

    # Prompt and data
    instruction: str = INSTRUCTION
    """text after the question in the user's message (ours: asks for the `#### <number>` line the reward reads)"""
    system_prompt: Optional[str] = None
    """a system message before the user's (chat template only; None: none)"""
    chat_template: bool = True
    """use the tokenizer's chat template when it has one; --no-chat-template: plain `Question: ...\nAnswer:` text"""
    question_field: str = "question"
    """the field of a data row holding the question (JSONL or the hub dataset)"""
    answer_field: str = "answer"
    """the field of a data row holding the reference answer, text ending in `#### <number>`"""

    # The run
    exp_name: str = SCRIPT
    """the name of this experiment (part of the default run folder's name: 1 to 100 characters, no `/`)"""
    seed: int = 1
    """seed of the experiment"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = True
    """if toggled, cuda will be used when available"""
    torch_threads: Optional[int] = None
    """number of CPU threads torch may use (None: torch's choice); 1 avoids oversubscription on a shared machine"""
    track: bool = False
    """if toggled, this experiment will be tracked with Weights and Biases"""
    wandb_project_name: str = "vaco"
    """the wandb's project name"""
    wandb_entity: Optional[str] = None
    """the entity (team) of wandb's project"""
    save_model: bool = False
    """if toggled, save model and tokenizer with `save_pretrained` to <run_dir>/model at the end (also when stopped)"""
    run_dir: Optional[str] = None
    """folder of the run: run.json, args.json, TensorBoard logs, checkpoints, the saved model (None: a new folder
    runs/gsm8k__<exp_name>__<loss>__<seed>__<time>); a folder holding anything else is refused"""
    resume: bool = False
    """continue the run in --run-dir from its last checkpoint (the other flags must match its args.json; a run
    that stopped before its first checkpoint starts again from the beginning; a finished one is left as it is)"""
    overwrite: bool = False
    """if toggled, replace the run of this script in --run-dir: its files go, the folder and nothing else (a folder
    holding other files is refused); without it, an existing run is refused"""
    auto_resume: bool = False
    """resume the run in --run-dir if it is this command's run (its args.json holds these flags, but for what a resume may
    change), start it there if the folder holds no run or one that never started, refuse another run: a requeued
    job's command (a wandb sweep's agent turns it on, in runs/sweep-<sweep id>/<run id>)"""
    checkpoint_every: int = 10
    """write <run_dir>/checkpoint.pt every this many iterations and at the end (0: only at the end)"""


@dataclass
class Setup:
    """What a start derives from the arguments, the same all run long (the data, the tokenizer, the sizes, the sampling
    set-up, where the process runs), and this process's own resources (the writer, the phase clocks). Nothing here is
    checkpointed: a resume derives it again from the same arguments."""

    args: Args
    rank: int
    world: int
    run_dir: str
    device: torch.device
    comm_device: torch.device  # where collectives run: the GPU under NCCL, else the CPU (gloo)
    use_bf16: bool
    tokenizer: object
    stop_ids: list[int]
    pad_id: int
    sample_config: GenerationConfig
    greedy_config: GenerationConfig
    checkpoint_generation_config: GenerationConfig  # the model's own, put back when it is saved
    train_rows: list[tuple[str, float]]
    eval_rows: list[tuple[str, float]]
    train_prompts: list[list[int]]
    eval_prompts: list[list[int]]
    num_iterations: int
    local_prompts: int  # this rank's prompts of a minibatch: whole groups, so GRPO's advantages stay local
    local_sequences: int
    single_pass: bool  # this rank's share of a minibatch is one micro-batch
    final_tv_batches: int  # micro-batches of each minibatch scored for lag/final_tv
    reward_functions: list  # (name, function, weight) of each reward function
    restart: bool = False  # --resume of a run that stopped before its first checkpoint: it starts again
    writer: Optional[SummaryWriter] = None  # the main process's
    start_time: float = 0.0
    iteration_start: float = 0.0
    timers: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # seconds per phase

    @property
    def main_process(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world > 1

    @property
    def steps_per_iteration(self) -> int:
        return self.args.forward_lag * self.args.num_epochs

    def all_reduce(self, values: list[float], op=None) -> list[float]:
        """Sums (or min/max) over ranks, so logged statistics and the filter's D are the whole batch's."""
        if not self.distributed:
            return values
        tensor = torch.tensor(values, dtype=torch.float64, device=self.comm_device)
        torch.distributed.all_reduce(tensor, op=op or torch.distributed.ReduceOp.SUM)
        return tensor.tolist()

    def autocast(self):
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16, enabled=self.use_bf16)

    def synchronize(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def start_clock(self):
        """A new iteration: its phase timers start from zero."""
        self.timers = collections.Counter()
        self.iteration_start = time.perf_counter()

    @contextlib.contextmanager
    def timed(self, phase: str):
        self.synchronize()
        begin = time.perf_counter()
        yield
        self.synchronize()
        self.timers[phase] += time.perf_counter() - begin


@dataclass
class State:
    """The training state: what the iterations move on and a checkpoint saves (save_checkpoint), made by
    initial_state and loaded by restore_checkpoint; with it, the two models that are not checkpointed but go with the
    policy (the generator, which loads the drawn policy of the buffer, and the frozen reference of --beta)."""

    model: torch.nn.Module
    generator: torch.nn.Module  # the model itself; with backward lag a copy that loads the drawn policy
    optimizer: torch.optim.Optimizer
    policy_buffer: Optional[collections.deque]  # with backward lag: the lag+1 most recent weights, on the host
    data_rng: np.random.Generator  # the data order and the buffer draw: the same on every rank
    order: collections.deque  # the training rows still to be drawn, in their order
    run_name: str
    run_id: Optional[str] = None  # run.json's, written into every checkpoint's header (the main process's)
    reference: Optional[torch.nn.Module] = None  # with --beta and no LoRA: the frozen initial model
    history: dict = dataclasses.field(default_factory=lambda: {"steps": [], "iterations": [], "evals": []})
    counters: dict = dataclasses.field(default_factory=lambda: {"global_step": 0, "tokens_seen": 0})
    first_iteration: int = 1
    wandb_id: Optional[str] = None


def main(args: Args) -> dict:
    """Run the experiment: the start (the run folder, the data and model, the state fresh or from the checkpoint), the
    iterations, the end. Returns the per-step, per-iteration and evaluation histories."""
    try:
        args = completed_args(args)
    except ValueError as error:
        refuse(str(error))
    setup, state, finished = start_run(args)
    if finished:
        return state.history
    try:
        finish(setup, state, iterate(setup, state))
    except OSError as error:  # a full disk, a read-only or vanished folder: the last checkpoint stays whole
        print(f"error: cannot write {error.filename or setup.run_dir}: {error.strerror or error}", file=sys.stderr)
        raise SystemExit(1)
    return state.history


# ======================================================================================================================
# The run's plumbing: validation, the run folder, the data and the model, checkpoints, signals, logging, saving and
# evaluation: nothing below is the algorithm, which reads above (the functions and main).
# ======================================================================================================================

# ---------------------------------------------------------------- the flags' checks (read-only: nothing is made or written)


def refuse(message: str):
    """Bad input: one line on stderr (a message of several lines is joined), exit code 2."""
    print("error: " + " ".join(line.strip() for line in message.strip().splitlines()), file=sys.stderr)
    raise SystemExit(2)


def normalise_bool_flags(argv):
    """wandb sweeps pass booleans as `--flag=True`; tyro only knows `--flag` / `--no-flag`."""
    bools = {field.name for field in dataclasses.fields(Args) if field.type is bool}
    argv = list(argv)
    for i, arg in enumerate(argv):
        m = re.fullmatch(r"--([\w-]+)=(true|false)", arg, flags=re.IGNORECASE)
        if m and m.group(1).replace("-", "_") in bools:
            argv[i] = ("--" if m.group(2).lower() == "true" else "--no-") + m.group(1).replace("_", "-")
    return argv


def tyro_cli(argv, default=None):
    """tyro.cli on Args; its boxed error becomes a one-line ValueError: the box's first paragraph, less its title."""
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            return tyro.cli(Args, args=argv, default=default)
    except SystemExit as e:
        if not e.code:  # --help
            sys.stderr.write(captured.getvalue())
            raise
        text = re.sub(r"\x1b\[[0-9;]*m|[\u2500-\u257f]", " ", captured.getvalue()).strip()  # no colours, no box
        raise ValueError(" ".join(re.split(r"\n\s*\n", text)[0].split("\n", 1)[-1].split()))


def looks_like_path(model_id: str) -> bool:
    """Hub ids are `name` or `org/name` in letters, digits, `-`, `_` and `.`; anything else, or an id whose first part
    is a folder here (`models/qwen` with a `models/` folder), is meant as a local folder."""
    try:
        huggingface_hub.utils.validate_repo_id(model_id)
    except HFValidationError:
        return True
    return os.path.exists(model_id) or ("/" in model_id and os.path.isdir(model_id.split("/")[0]))


def main_rank() -> bool:
    """The process that owns the run folder: the only one under torchrun that checks, claims and writes it."""
    return int(os.environ.get("RANK", "0")) == 0


# The flags' checks: field(s) -> rule -> what the flag must be. Each flag is checked by its meaning.
CHECKS = [
    (
        ("num_iterations", "forward_lag", "prompts_per_step", "micro_batch_size", "eval_size", "num_epochs"),
        lambda v: 1 <= v < 2**31,
        "in [1, 2**31)",
    ),
    (("total_steps",), lambda v: v is None or 1 <= v < 2**31, "in [1, 2**31)"),
    (("num_generations",), lambda v: 2 <= v < 2**31, "in [2, 2**31) (GRPO needs a group)"),
    (
        ("lag", "eval_every", "checkpoint_every", "generation_batch_size", "log_completions_every", "num_completions_to_log"),
        lambda v: 0 <= v < 2**31,
        "in [0, 2**31)",
    ),
    (("max_new_tokens",), lambda v: 1 <= v <= 2**17, "in [1, 131072] (longer than the context of the models meant here)"),
    (("question_field", "answer_field"), lambda v: len(v) >= 1, "a field name, not empty"),
    (("final_tv_fraction",), lambda v: 0 <= v <= 1, "in [0, 1]"),
    (("seed",), lambda v: 0 <= v < 2**32, "in [0, 2**32) (numpy's seed range)"),
    (("torch_threads",), lambda v: v is None or 1 <= v <= 4096, "in [1, 4096]"),
    # Real numbers: NaN fails every comparison; the bounds and their reasons are in the Args docstrings.
    (("temperature",), lambda v: 0.01 <= v <= 10, "in [0.01, 10]"),
    (("learning_rate",), lambda v: 1e-10 <= v <= 1, "in [1e-10, 1]"),
    (("max_grad_norm",), lambda v: 1e-6 <= v <= 1e6, "in [1e-6, 1e6]"),
    (("clip_low",), lambda v: 1e-4 <= v < 1, "in [1e-4, 1)"),
    (("clip_high",), lambda v: 1e-4 <= v <= 100, "in [1e-4, 100]"),
    (("tv_threshold",), lambda v: 1e-6 <= v <= 2, "in [1e-6, 2] (D estimates a total variation, at most 1)"),
    (("beta",), lambda v: 0 <= v <= 100, "in [0, 100]"),
    (("warmup_ratio",), lambda v: 0 <= v <= 1, "in [0, 1]"),
    (("lora_r",), lambda v: 0 <= v <= 2**16, "in [0, 65536]"),
    (("lora_alpha",), lambda v: 0 < v <= 2**16, "in (0, 65536]"),
    (
        ("exp_name",),
        lambda v: 1 <= len(v) <= 100 and "/" not in v and "\0" not in v and v not in (".", ".."),
        "1 to 100 characters, without / or NUL and not . or .. (it names the default run folder)",
    ),
]


# What a resume may change: the rest is the saved run's. The run folder is where the run is now (it may have moved);
# the iteration count extends or shortens a run (with a constant learning rate: `schedule_change`); the rest only logs
# or saves.
RESUME_MAY_CHANGE = {
    "run_dir",
    "num_iterations",
    "total_steps",
    "resume",
    "overwrite",
    "auto_resume",
    "track",
    "torch_threads",
    "checkpoint_every",
    "save_model",
    "log_completions_every",
    "num_completions_to_log",
}


# Flags added since format 1's first runs, with the value that an args.json without them means.
ADDED_FLAGS = {"auto_resume": False}
PATH_FLAGS = ("data_file", "eval_data_file")  # files that must be regular files, kept absolute in args.json


MAX_GENERATION_BATCH = 2**20  # sequences of one generation batch, K x prompts-per-step x G: far above any real run


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def schedule_change(args: Args, saved: dict) -> Optional[str]:
    """Why a resume cannot change the run's length: a learning-rate schedule other than a constant rate with no warmup
    is laid out over the run's steps, which the saved run has already followed."""
    varies = saved["lr_scheduler_type"] != "constant" or saved["warmup_ratio"] > 0
    for name in ("num_iterations", "total_steps"):
        if varies and saved[name] != getattr(args, name):
            return f"--resume: {flag(name)} is {getattr(args, name)} here but {saved[name]} in the run, whose learning-rate schedule spans its steps"
    return None


def check_args(args: Args) -> None:
    """Raise ValueError with a one-line message for flags that cannot run. Read-only: nothing is made or written."""
    for field in dataclasses.fields(args):  # undecodable bytes of the command line reach Python as surrogates
        value = getattr(args, field.name)
        try:
            value.encode() if isinstance(value, str) else None
        except UnicodeEncodeError:
            raise ValueError(f"{flag(field.name)} is not valid UTF-8: {os.fsencode(value)!r}")
    for names, rule, meaning in CHECKS:
        for name in names:
            if not rule(getattr(args, name)):
                raise ValueError(f"{flag(name)} must be {meaning}, got {getattr(args, name)!r}")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if args.seed + world - 1 >= 2**32:
        raise ValueError(
            f"--seed + processes - 1 must be < 2**32 (each process seeds with seed + rank), got {args.seed + world - 1}"
        )
    if args.prompts_per_step % world:
        raise ValueError(
            f"--prompts-per-step ({args.prompts_per_step}) must be a multiple of the number of processes ({world})"
        )
    sequences = args.prompts_per_step // world * args.num_generations
    if sequences % args.micro_batch_size:
        raise ValueError(
            f"--micro-batch-size ({args.micro_batch_size}) must divide "
            f"--prompts-per-step x --num-generations{' / processes' if world > 1 else ''} ({sequences})"
        )
    if args.forward_lag * args.prompts_per_step * args.num_generations > MAX_GENERATION_BATCH:
        raise ValueError(f"--forward-lag x --prompts-per-step x --num-generations must be <= {MAX_GENERATION_BATCH} sequences")
    if args.total_steps and args.total_steps % (args.forward_lag * args.num_epochs):
        raise ValueError(
            f"--total-steps ({args.total_steps}) must be a multiple of --forward-lag x --num-epochs "
            f"({args.forward_lag * args.num_epochs})"
        )
    reward_functions(args)
    if args.lora_r and importlib.util.find_spec("peft") is None:
        raise ValueError("--lora-r needs the package peft (pip install peft)")
    for name in PATH_FLAGS:
        problem = getattr(args, name) is not None and input_file_problem(getattr(args, name))
        if problem:
            raise ValueError(f"{flag(name)} {problem}")
    if looks_like_path(args.model_id):
        problem = model_path_problem(os.path.expanduser(args.model_id))
        if problem:
            raise ValueError(f"--model-id {args.model_id}: {problem}")
    if main_rank():
        check_run_dir(args)


def model_path_problem(path: str) -> Optional[str]:
    """Why a local --model-id cannot be a model: not a folder of save_pretrained's files or one GGUF file, or a GGUF
    file without the packages that read it."""
    if not os.path.isdir(path) and not (os.path.isfile(path) and path.endswith(".gguf")):
        return "no such model folder or .gguf file"
    folder, gguf_file = model_files(path)
    if gguf_file is None and not os.path.isfile(os.path.join(folder, "config.json")):
        ggufs = [name for name in sorted(os.listdir(folder)) if name.endswith(".gguf")]
        if ggufs:
            return f"the folder holds several .gguf files ({listed(ggufs)}): pass one of them as --model-id"
        return "the folder holds neither config.json (a save_pretrained folder) nor a .gguf file"
    if gguf_file is not None:
        missing = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
        if missing:
            return f"reading a .gguf file needs the packages {' and '.join(missing)} (pip install {' '.join(missing)})"
    return None


def input_file_problem(path: str) -> Optional[str]:
    """Why `path` is not a data file: missing, a folder, or not a regular file (a FIFO, /dev/null: the data is read
    whole at every start, and a resume reads it again)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return f"{path} does not exist"
    except OSError as error:
        return f"{path}: cannot read it ({error.strerror})"
    if stat.S_ISDIR(mode):
        return f"{path} is a directory, not a JSONL file"
    if not stat.S_ISREG(mode):
        return f"{path} is not a regular file"
    return None


def parse_args(argv: Optional[list[str]] = None) -> Args:
    """tyro CLI plus check_args; reads the run folder but writes nothing. Bad input prints one `error:` line and exits
    with code 2."""
    try:
        args = completed_args(tyro_cli(normalise_bool_flags(sys.argv[1:] if argv is None else argv)))
    except ValueError as error:
        refuse(str(error))
    return args


def completed_args(args: Args) -> Args:
    """The flags a run starts with: the run folder of a wandb sweep's run (with_sweep_run_dir), --auto-resume's choice
    (resume_if_same_run), checked (check_args). ValueError for flags that cannot run; nothing is written."""
    args = with_sweep_run_dir(args)
    if args.auto_resume and not args.resume and not args.overwrite and args.run_dir and main_rank():
        args = resume_if_same_run(args)
    check_args(args)
    return args


def resume_if_same_run(args: Args) -> Args:
    """--auto-resume: a run in --run-dir is resumed if its args.json equals the command's, but for RESUME_MAY_CHANGE,
    else refused (ValueError); a folder without a run, or with one that never started, starts it. A folder in use is
    check_run_dir's to refuse."""
    if not os.path.exists(os.path.join(args.run_dir, RUN_FILE)):
        return args
    try:
        lock_run_dir(args.run_dir, look_only=True)
    except ValueError:  # in use: check_run_dir says so, after what it says first
        return args
    read_run_record(args.run_dir)
    if never_started(args.run_dir):
        return args
    saved = read_saved_args(args.run_dir)
    changed = [
        f"{name} {saved[name]!r} there, {stored(name, value)!r} here"
        for name, value in dataclasses.asdict(args).items()
        if name not in RESUME_MAY_CHANGE and stored(name, value) != saved[name]
    ]
    if changed:
        listed = "; ".join(changed[:3]) + ("; ..." if len(changed) > 3 else "")
        raise ValueError(f"{args.run_dir} holds another run ({listed}): choose another --run-dir")
    return dataclasses.replace(args, resume=True)


def with_sweep_run_dir(args: Args) -> Args:
    """Started by a wandb sweep's agent without --run-dir: the folder runs/sweep-<sweep id>/<run id>, with --auto-resume,
    so that the agent's rerun of a preempted run (same WANDB_RUN_ID, same arguments) continues it, not starts over."""
    sweep_id, run_id = os.environ.get("WANDB_SWEEP_ID", ""), os.environ.get("WANDB_RUN_ID", "")
    if args.run_dir or args.resume or args.overwrite or not re.fullmatch(r"\w+ \w+", f"{sweep_id} {run_id}"):
        return args
    return dataclasses.replace(args, run_dir=f"runs/sweep-{sweep_id}/{run_id}", auto_resume=True)


# ---------------------------------------------------------------- the run folder

# A run of this script writes only the entries below into it; run.json makes a folder a run. Every check is
# read-only and made before anything is written, then again under the folder's lock (claim_run_dir).


RUN_FILE, ARGS_FILE, SUMMARY_FILE, LOCK_FILE = "run.json", "args.json", "summary.json", "run.lock"


CHECKPOINT = "checkpoint.pt"


PREVIOUS_CHECKPOINT = "checkpoint.prev.pt"  # the one before the last, kept when a new one is written


RUN_FILES = {RUN_FILE, ARGS_FILE, SUMMARY_FILE, CHECKPOINT, PREVIOUS_CHECKPOINT, LOCK_FILE}


WANDB_LOST = []  # why wandb stopped taking this process's scalars (log_to_wandb), if it did


OWN_FOLDERS = {"model", "model.tmp", "model.old"}  # save_pretrained's folder and its swap leftovers (save_model)


EVENTS_PREFIX = "events.out.tfevents."  # TensorBoard's files


CHECKPOINT_HEADER_BYTES = (
    256  # the checkpoint's first line: JSON padded with spaces, then "\n"; the torch.save payload follows
)


VERIFIED = set()  # (device, inode, size, mtime) of checkpoints whose digest this process checked: hashed once


def written_by_a_run(folder: str, name: str, recorded: Optional[list] = None) -> bool:
    """Whether `name` in `folder` is something a run of this script writes: its files, their `.tmp` versions, the
    model folders, and the TensorBoard files that run.json records as written (`recorded`; None: any, as a run.json of
    an earlier version records none, or a start's own new entries). A link never is (it is the user's)."""
    path = os.path.join(folder, name)
    if os.path.islink(path):
        return False
    if name in OWN_FOLDERS:
        return os.path.isdir(path)
    base = name[: -len(".tmp")] if name.endswith(".tmp") else name
    events = base.startswith(EVENTS_PREFIX) and (recorded is None or base in recorded)
    return not os.path.isdir(path) and (base in RUN_FILES or events)


def open_own_file(path: str, flags: int) -> int:
    """os.open of a file of the run folder, never through a link: a symbolic link is refused (O_NOFOLLOW), and so is
    what is not a regular file of one name (a hard link's data is also a file elsewhere), with an OSError that says
    so. Opened without O_TRUNC, so that nothing is cut before the check."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as error:
        if error.errno != errno.ELOOP:
            raise
        raise OSError(errno.ELOOP, f"{path} is a symbolic link, which a run writes nothing through", path)
    found = os.fstat(fd)
    if stat.S_ISREG(found.st_mode) and found.st_nlink == 1:
        return fd
    os.close(fd)
    what = f"a hard link ({found.st_nlink} names)" if stat.S_ISREG(found.st_mode) else "not a regular file"
    raise OSError(errno.EMLINK, f"{path} is {what}, which a run writes nothing through", path)


def args_digests(saved: dict) -> dict:
    """The SHA-256 of each argument as args.json holds it: run.json keeps them from the run's start, so that a resume
    finds an argument changed by hand since."""
    return {name: hashlib.sha256(json.dumps(value).encode()).hexdigest() for name, value in saved.items()}


def leftover(folder: str, name: str) -> bool:
    """What a start killed before it wrote run.json can leave: the lock and `.tmp` files. A folder holding only these
    counts as empty."""
    return written_by_a_run(folder, name) and (name == LOCK_FILE or name.endswith(".tmp"))


def listed(names: list[str], shown: int = 5) -> str:
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")


def read_json(path: str) -> dict:
    """The JSON object in `path`; ValueError saying what is wrong with the file."""
    try:
        with open(path, "rb") as handle:
            value = json.loads(handle.read())
    except FileNotFoundError:
        raise ValueError(f"{path} does not exist")
    except OSError as error:
        raise ValueError(f"cannot read {path}: {error.strerror}")
    except ValueError as error:  # not UTF-8, not JSON
        raise ValueError(f"{path} is not JSON ({error})")
    if not isinstance(value, dict):
        raise ValueError(f"{path} is not a JSON object")
    return value


def read_run_record(folder: str) -> dict:
    """run.json: the script whose run the folder holds, the format and the run's id."""
    path = os.path.join(folder, RUN_FILE)
    run = read_json(path)
    if not all(isinstance(run.get(key), str) for key in ("script", "run_id")) or type(run.get("format")) is not int:
        raise ValueError(f"{path} is not a run description (script, format, run_id)")
    if run["script"] != SCRIPT:
        raise ValueError(f"{folder} holds a run of {run['script']}, not of {SCRIPT}")
    if run["format"] != RUN_FORMAT:
        raise ValueError(f"{folder} holds a run of format {run['format']}; this script reads format {RUN_FORMAT}")
    # What a run.json of this version also records (write_run_files, record_written); one of an earlier version lacks them.
    files, digests = run.get("files", []), run.get("args_sha256", {})
    names = isinstance(files, list) and all(isinstance(f, str) and "/" not in f and f not in ("", ".", "..") for f in files)
    if not names or not (isinstance(digests, dict) and all(isinstance(d, str) for d in digests.values())):
        raise ValueError(f"{path} is not a run description (its files or args_sha256 are altered)")
    return run


def record_written(run_dir: str, name: str):
    """Add `name` to the files that run_dir's run.json records as written by the run; a run.json of an earlier version
    records none and stays."""
    run = read_run_record(run_dir)
    if "files" in run and name not in run["files"]:
        write_json(os.path.join(run_dir, RUN_FILE), {**run, "files": [*run["files"], name]})


def check_run_dir(args: Args):
    """Raise ValueError if the run folder cannot be used: flags that exclude each other, a path that cannot be a
    writable folder, or what check_run_dir_contents finds in it. The default folder is new (made by the claim): only runs/."""
    if args.resume and args.overwrite:
        raise ValueError("--resume and --overwrite exclude each other")
    if args.run_dir == "":
        raise ValueError("--run-dir must name a folder, got ''")
    if args.resume and not args.run_dir:
        raise ValueError("--resume needs the --run-dir of the run to continue (one started without it is in runs/gsm8k__...)")
    if args.overwrite and not args.run_dir:
        raise ValueError("--overwrite needs --run-dir: the folder of the run to replace")
    if args.auto_resume and args.overwrite:
        raise ValueError("--auto-resume and --overwrite exclude each other")
    if args.auto_resume and not args.run_dir:
        raise ValueError("--auto-resume needs --run-dir: a folder named by the run (e.g. runs/gsm8k__vaco__k4__s1)")
    path, shown = (args.run_dir, f"--run-dir {args.run_dir}") if args.run_dir else ("runs", "runs/ (the default)")
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"{shown} is a file")
    existing = path
    while not os.path.exists(existing):
        existing = os.path.dirname(os.path.abspath(existing))
    if not os.path.isdir(existing):
        raise ValueError(f"{shown} is under a file ({existing})")
    if not os.access(existing, os.W_OK | os.X_OK):  # as root, /proc and the like are refused when the folder is made
        raise ValueError(f"{shown} is not writable" + ("" if existing == path else f" ({existing} is not)"))
    limit = name_limit(existing)
    if any(len(os.fsencode(part)) > limit for part in os.path.abspath(path).split("/")):
        raise ValueError(f"{shown}: a name in it is longer than the {limit} bytes that the file system takes")
    default = f"{default_run_name(args)}-99"  # room for claim_default_run_dir's -2, -3, ...
    if not args.run_dir and len(os.fsencode(default)) > limit:
        raise ValueError(
            f"--exp-name makes the run folder's name {len(os.fsencode(default))} bytes long; the file system takes {limit}"
        )
    if args.run_dir:
        lock_run_dir(args.run_dir, look_only=True)  # whatever else would be said of the folder, its run is in progress
        check_run_dir_contents(args, args.run_dir)


def name_limit(folder: str) -> int:
    """The longest file name, in bytes, that the file system holding `folder` takes."""
    with contextlib.suppress(OSError, ValueError):
        return os.pathconf(folder, "PC_NAME_MAX")
    return 255


def default_run_name(args: Args) -> str:
    """The default run folder's name (runs/<it>, or <it>-2, -3, ... where it is taken)."""
    return f"gsm8k__{args.exp_name}__{args.loss}__{args.seed}__{int(time.time())}"


def check_run_dir_contents(args: Args, folder: str):
    """Raise ValueError if `folder` cannot take this start: a fresh start needs it empty (leftovers aside); --overwrite
    a run of this script and nothing else; --resume a run of this script whose args.json and checkpoint check out. What
    a run writes under a name it reuses (the lock, a .tmp, the model folders) is never a link out of the folder."""
    try:
        names = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
    except OSError as error:
        raise ValueError(f"cannot read {folder}: {error.strerror}")
    for name in [name for name in names if name == LOCK_FILE or name.endswith(".tmp") or name in OWN_FOLDERS]:
        found = os.lstat(os.path.join(folder, name))  # symbolic, or hard (a file with other names)
        if stat.S_ISLNK(found.st_mode) or (stat.S_ISREG(found.st_mode) and found.st_nlink > 1):
            raise ValueError(
                f"{os.path.join(folder, name)} is a link, which a run writes nothing through: remove it, or choose another --run-dir"
            )
    if args.resume:
        return check_resume(args, folder)
    content = [name for name in names if not leftover(folder, name)]
    if not content:
        return
    if RUN_FILE not in content:
        raise ValueError(f"{folder} holds files that are not a run of {SCRIPT}: {listed(content)}; choose another --run-dir")
    try:
        recorded = read_run_record(folder).get("files")
    except ValueError as error:
        raise ValueError(f"{error}; choose another --run-dir")
    if not args.overwrite and not (args.auto_resume and never_started(folder)):
        raise ValueError(f"{folder} already holds a run: --resume continues it, --overwrite replaces it")
    others = [name for name in content if not written_by_a_run(folder, name, recorded)]
    if others:
        raise ValueError(
            f"--overwrite: {folder} holds files that are not part of a run: {listed(others)}; move them away first"
        )


def check_resume(args: Args, folder: str):
    """Raise ValueError if the run in `folder` cannot continue with these flags: no run of this script and format, an
    args.json that is not this script's arguments or differs beyond RESUME_MAY_CHANGE, or a damaged checkpoint."""
    if not os.path.exists(os.path.join(folder, RUN_FILE)):
        raise ValueError(f"--resume: {folder} holds no run")
    saved_args = os.path.join(folder, ARGS_FILE)
    try:
        run = read_run_record(folder)
        saved = read_saved_args(folder)
    except ValueError as error:
        raise ValueError(f"--resume: {error}")
    for name, value in dataclasses.asdict(args).items():
        if name not in RESUME_MAY_CHANGE and saved[name] != stored(name, value):
            raise ValueError(f"--resume: {flag(name)} is {stored(name, value)} here but {saved[name]} in {saved_args}")
    problem = schedule_change(args, saved) or checkpoint_check(folder, run["run_id"])
    if problem:
        raise ValueError(problem)


def read_saved_args(run_dir: str) -> dict:
    """The run's args.json as a dict; ValueError naming the first key that is missing, unknown or not of its Args
    field's type, or the keys changed since the run started (the digests in run.json)."""
    path = os.path.join(run_dir, ARGS_FILE)
    if not os.path.isfile(path):
        never = never_started(run_dir)
        raise ValueError(
            f"{path} is missing: "
            + ("the run never started; --auto-resume or " if never else "")
            + "--overwrite starts it afresh"
        )
    saved = read_json(path)
    kinds = {field.name: field.type for field in dataclasses.fields(Args)}
    full = {**ADDED_FLAGS, **saved}
    missing, unknown = sorted(kinds.keys() - full.keys()), sorted(full.keys() - kinds.keys())
    if missing or unknown:
        raise ValueError(f"{path} " + (f"lacks {', '.join(missing)}" if missing else f"has unknown keys {', '.join(unknown)}"))
    for name, kind in kinds.items():
        fits, words = json_fits(full[name], kind)
        if not fits:
            raise ValueError(f"{path}: {name} must be {words}, got {json.dumps(full[name])[:60]}")
    started = read_run_record(run_dir).get("args_sha256")
    changed = [name for name, digest in args_digests(saved).items() if started is not None and started.get(name) != digest]
    if changed:
        raise ValueError(
            f"{path} has changed since the run started ({', '.join(changed)}): put it back; a run's arguments change "
            "only on the command line, where --resume allows"
        )
    return full


def never_started(run_dir: str) -> bool:
    """Whether run_dir's run.json is all that a start killed before it wrote args.json left (with run.lock and .tmp
    files): a run to start again."""
    return all(name == RUN_FILE or leftover(run_dir, name) for name in os.listdir(run_dir))


def json_fits(value, kind):
    """Whether a value read from JSON has the type of an Args field (an int is a float too; a bool is not an int), and
    that type in words."""
    if typing.get_origin(kind) is typing.Union:
        fits = [json_fits(value, option) for option in typing.get_args(kind)]
        return any(fit for fit, _ in fits), " or ".join(words for _, words in fits)
    if typing.get_origin(kind) is Literal:
        words = "one of " + ", ".join(map(json.dumps, typing.get_args(kind)))
        return isinstance(value, str) and value in typing.get_args(kind), words
    words = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(kind, "null")
    return type(value) in ((int, float) if kind is float else (kind,)), words


def stored(name: str, value):
    """A flag's value as args.json keeps it: the data files and a local model folder as absolute paths, so that a run
    started with a relative --data-file resumes from any working folder (the flag given then is compared the same
    way)."""
    local = name in PATH_FLAGS or name == "model_id" and looks_like_path(value)
    return os.path.abspath(os.path.expanduser(value)) if local and value is not None else value


# ---------------------------------------------------------------- the checkpoint's format


class HashingWriter:
    """What torch.save writes (it needs write() and flush()), hashed on its way into the checkpoint file. Keeps the
    OSError of a failed write: torch.save then raises its own RuntimeError while it closes the archive."""

    def __init__(self, handle):
        self.handle, self.sha256, self.error = handle, hashlib.sha256(), None

    def write(self, data) -> int:
        self.sha256.update(data)
        try:
            return self.handle.write(data)
        except OSError as error:
            self.error = error
            raise

    def flush(self):
        self.handle.flush()


class Payload:
    """The checkpoint file from its payload on, as a file of its own: torch.load reads the payload in place, once,
    however large it is."""

    def __init__(self, handle, offset: int):
        self.handle, self.offset = handle, offset
        handle.seek(offset)

    def read(self, size: int = -1) -> bytes:
        return self.handle.read(size)

    def readinto(self, buffer) -> int:
        return self.handle.readinto(buffer)

    def seek(self, position: int, whence: int = os.SEEK_SET) -> int:
        return self.handle.seek(position + self.offset if whence == os.SEEK_SET else position, whence) - self.offset

    def tell(self) -> int:
        return self.handle.tell() - self.offset


def checkpoint_header(run_id: str, sha256: str) -> bytes:
    text = json.dumps({"script": SCRIPT, "format": RUN_FORMAT, "run_id": run_id, "sha256": sha256})
    return text.encode().ljust(CHECKPOINT_HEADER_BYTES - 1) + b"\n"


def read_header(handle) -> dict:
    """The checkpoint's header line; ValueError where there is none (an empty or cut file, or not a checkpoint)."""
    line = handle.read(CHECKPOINT_HEADER_BYTES)
    try:
        header = json.loads(line) if len(line) == CHECKPOINT_HEADER_BYTES and line.endswith(b"\n") else None
    except ValueError:
        header = None
    if not isinstance(header, dict) or not all(isinstance(header.get(key), str) for key in ("script", "run_id", "sha256")):
        raise ValueError("no checkpoint header")
    return header


def checkpoint_problem(path: str, run_id: str) -> Optional[str]:
    """Why the run `run_id` cannot resume from the checkpoint at `path`: unreadable, not this script's, another run's,
    or damaged (the payload's SHA-256 is not the header's). The payload is hashed in chunks, once per version of the
    file in this process: a checkpoint can be several GB, and a start checks it before and after its claim."""
    try:
        with open(path, "rb") as handle:
            header = read_header(handle)
            if header["script"] != SCRIPT:
                return f"{path} is a checkpoint of {header['script']}, not of {SCRIPT}"
            if header.get("format") != RUN_FORMAT:
                return f"{path} is in format {header.get('format')}; this script reads format {RUN_FORMAT}"
            if header["run_id"] != run_id:
                return f"{path} belongs to another run (its run_id is {header['run_id']}, run.json's {run_id})"
            found = os.fstat(handle.fileno())
            version = (found.st_dev, found.st_ino, found.st_size, found.st_mtime_ns)
            if version in VERIFIED:
                return None
            digest = hashlib.sha256()
            while chunk := handle.read(2**24):
                digest.update(chunk)
    except ValueError as error:
        return f"{path} is damaged ({error})"
    except OSError as error:
        return f"cannot read {path}: {error.strerror}"
    if digest.hexdigest() != header["sha256"]:
        return f"{path} is damaged (digest mismatch)"
    VERIFIED.add(version)
    return None


def checkpoint_to_resume(folder: str) -> Optional[str]:
    """The checkpoint a --resume continues from: checkpoint.pt, or checkpoint.prev.pt where checkpoint.pt is missing
    (a crash between the two renames of write_checkpoint_file); None before the run's first checkpoint."""
    for name in (CHECKPOINT, PREVIOUS_CHECKPOINT):
        if os.path.exists(os.path.join(folder, name)):
            return os.path.join(folder, name)
    return None


def checkpoint_check(folder: str, run_id: str) -> Optional[str]:
    """checkpoint_problem of the checkpoint a resume would read, with the remedy: the previous checkpoint where it is
    whole, else --overwrite. An unreadable file (permissions) is not damaged: no remedy is offered."""
    path = checkpoint_to_resume(folder)
    problem = path and checkpoint_problem(path, run_id)
    if not problem:
        return None
    previous = os.path.join(folder, PREVIOUS_CHECKPOINT)
    if problem.startswith("cannot read"):
        return f"--resume: {problem}"
    if path != previous and os.path.exists(previous) and checkpoint_problem(previous, run_id) is None:
        return f"--resume: {problem}; the one before is whole: mv {previous} {path} to resume from it"
    return f"--resume: {problem}; --overwrite starts the run afresh"


def load_checkpoint(path: str) -> dict:
    """The state a checkpoint holds (checkpoint_problem has checked the file)."""
    with open(path, "rb") as handle:
        read_header(handle)
        return torch.load(Payload(handle, CHECKPOINT_HEADER_BYTES), map_location="cpu", weights_only=False)


# ---------------------------------------------------------------- the start: the claim, data and model, training state


@dataclass
class Claim:
    """The main process's hold on its run folder (locked until the process ends) and what a failed start must undo."""

    run_dir: str
    run_name: str
    run_id: str  # run.json's: the resumed run's, or a new one
    created: bool  # this start made the folder
    before: set  # the folder's entries when it was claimed
    written: set = dataclasses.field(default_factory=set)  # run.json and args.json, once this start writes them


# The descriptor of the main process's locked run.lock, open while the process lives: closing any descriptor of the
# file releases the process's lock on it (POSIX), so a later main() in this process on the same folder reuses it.
HELD_LOCK = {"fd": None}


def claim_run_dir(args: Args, run_name: str) -> Claim:
    """Make and lock the main process's run folder, then check it again under the lock: another process may have
    started in it since check_args. A default folder is runs/<run_name>, or runs/<run_name>-2, -3, ... when taken."""
    try:
        if args.run_dir is None:
            run_dir, created = claim_default_run_dir(run_name), True
            run_name = os.path.basename(run_dir)
        else:
            run_dir, created = args.run_dir, not os.path.isdir(args.run_dir)
            os.makedirs(run_dir, exist_ok=True)
            lock_run_dir(run_dir)
        claim = Claim(run_dir, run_name, uuid.uuid4().hex, created, set(os.listdir(run_dir)))
    except ValueError as error:  # another process holds the folder, or run.lock is a link
        refuse(str(error))
    except OSError as error:
        refuse(f"cannot write {error.filename or args.run_dir or 'runs'}: {error.strerror}")
    try:
        check_run_dir_contents(args, run_dir)
    except ValueError as error:
        roll_back(claim)
        refuse(str(error))
    if args.resume:
        claim.run_id = read_run_record(run_dir)["run_id"]
    return claim


def claim_default_run_dir(run_name: str) -> str:
    """runs/<run_name>, made with os.mkdir, which fails on a folder that exists: two runs started in the same second
    get two folders (the second one runs/<run_name>-2)."""
    os.makedirs("runs", exist_ok=True)
    for number in itertools.count(1):
        run_dir = os.path.join("runs", run_name if number == 1 else f"{run_name}-{number}")
        with contextlib.suppress(FileExistsError, ValueError):  # ValueError: another process took it, with --run-dir
            os.mkdir(run_dir)
            lock_run_dir(run_dir)
            return run_dir


def lock_run_dir(run_dir: str, look_only: bool = False):
    """Take run_dir's lock, run.lock (a POSIX lock: held until the process ends, however it ends, and honoured over
    NFS), and write who holds it; ValueError naming the process that holds it, as the lock file says. Where the file
    system has no locks, a warning, and the start goes on. look_only (check_run_dir, resume_if_same_run): make and write
    nothing, and let the lock go at once (the lock this process holds is not tested: closing any descriptor of the file
    would release it)."""
    path = os.path.join(run_dir, LOCK_FILE)
    held = HELD_LOCK["fd"]
    if held is not None and os.path.lexists(path) and os.path.samestat(os.lstat(path), os.fstat(held)):
        return
    if held is not None and not look_only:  # the lock of an earlier run of this process, on another folder
        os.close(held)
        HELD_LOCK["fd"] = None
    try:
        fd = open_own_file(path, os.O_RDWR | (0 if look_only else os.O_CREAT))
    except OSError as error:
        if look_only:  # no lock file, or a link (which check_run_dir_contents refuses)
            return
        if error.errno in (errno.ELOOP, errno.EMLINK):  # open_own_file's refusal of a link
            raise ValueError(f"{error.strerror}: remove it, or choose another --run-dir")
        raise
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        if error.errno in (errno.EACCES, errno.EAGAIN):
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "a process that has not yet said which"
            os.close(fd)
            raise ValueError(f"{run_dir} is in use by {holder}")
        if not look_only and error.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
            print(f"warning: {run_dir} cannot be locked ({error.strerror}): make sure no other process uses it", flush=True)
        elif not look_only:
            os.close(fd)
            raise
    if look_only:
        os.close(fd)
        return
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"process {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
    HELD_LOCK["fd"] = fd


def remove_entry(path: str):
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.remove(path)


def roll_back(claim: Claim):
    """A start that fails after its claim leaves the folder as it found it: the entries it wrote go (best effort), and
    the folder too if this start made it and nothing else is in it."""
    with contextlib.suppress(OSError):
        for name in os.listdir(claim.run_dir):
            if (
                name != LOCK_FILE
                and written_by_a_run(claim.run_dir, name)
                and (name not in claim.before or name in claim.written)
            ):
                remove_entry(os.path.join(claim.run_dir, name))
    if claim.created:
        with contextlib.suppress(OSError):
            os.remove(os.path.join(claim.run_dir, LOCK_FILE))
            os.rmdir(claim.run_dir)


def start_run(args: Args) -> tuple[Setup, State, bool]:
    """Everything before the iterations: the run folder claimed (main process), the data and the model, the training
    state, fresh or the checkpoint's (--resume), then the run folder's files, wandb and TensorBoard. Returns the Setup,
    the State and whether the run has already finished (a resume that leaves it as it is). A start that fails (bad
    data, a model that does not load, no wandb login, a full disk) leaves the folder as it found it."""
    run_name = default_run_name(args)
    claim = claim_run_dir(args, run_name) if main_rank() else None
    try:
        setup, model, reference = load_data_and_model(args, claim, run_name)
        if setup.distributed and args.auto_resume:  # every process continues or starts as the main one decided
            decided = [args.resume]
            torch.distributed.broadcast_object_list(decided, src=0)
            args = setup.args = dataclasses.replace(args, resume=decided[0])
        state = initial_state(setup, model, reference, claim.run_name if claim else run_name, claim.run_id if claim else None)
        path = checkpoint_to_resume(setup.run_dir) if args.resume else None
        setup.restart = args.resume and path is None
        if setup.restart and setup.main_process:
            print(f"--resume: no {CHECKPOINT} in {setup.run_dir}: starting the run again from the beginning", flush=True)
        if path is not None:
            restore_checkpoint(setup, state, path)
        if run_has_finished(setup, state):
            return setup, state, True
        write_run_start(setup, state, claim)
    except BaseException:
        if claim:
            roll_back(claim)
        raise
    return setup, state, False


def load_data_and_model(
    args: Args, claim: Optional[Claim], run_name: str
) -> tuple[Setup, torch.nn.Module, Optional[torch.nn.Module]]:
    """Seeds, the data, the model on its device (and the process group under torchrun) and the sampling set-up: the
    Setup, the model to train and the reference of --beta. Bad data stops the run before any model is loaded."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))

    # Each rank samples its own completions; the data order is shared, so ranks split the same prompts.
    random.seed(args.seed + rank)
    np.random.seed(args.seed + rank)
    torch.manual_seed(args.seed + rank)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    if args.torch_threads is not None:
        torch.set_num_threads(args.torch_threads)

    # Inputs first, so bad data stops the run before any model is loaded.
    fields = (args.question_field, args.answer_field)
    train_rows = load_split(args.data_file, "train", fields)
    eval_rows = load_split(args.eval_data_file, "test", fields)[: args.eval_size] if args.eval_every > 0 else []
    model, tokenizer = load_model_and_tokenizer(args.model_id)

    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        if args.tf32:
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
    if world > 1:
        torch.distributed.init_process_group("nccl" if device.type == "cuda" else "gloo")
    use_bf16 = args.bf16 and device.type == "cuda"

    model.to(device)
    if use_bf16:
        keep_output_head_fp32(model)
    if args.gradient_checkpointing:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    stop_ids = stop_token_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id
    # Replace the checkpoint's generation defaults (top-k, top-p, repetition penalty...) so that tokens
    # are drawn from softmax(logits / T) exactly, the distribution beta scores. Restored before saving.
    checkpoint_generation_config = model.generation_config
    model.generation_config = GenerationConfig(eos_token_id=stop_ids, pad_token_id=pad_id)
    sample_config = GenerationConfig(
        do_sample=True, temperature=args.temperature, top_k=0, top_p=1.0, max_new_tokens=args.max_new_tokens
    )
    model, reference = trainable_policy(model, args)

    local_prompts = args.prompts_per_step // world
    local_sequences = local_prompts * args.num_generations
    setup = Setup(
        args=args,
        rank=rank,
        world=world,
        run_dir=claim.run_dir if claim else args.run_dir or os.path.join("runs", run_name),
        device=device,
        comm_device=device if world > 1 and device.type == "cuda" else torch.device("cpu"),
        use_bf16=use_bf16,
        tokenizer=tokenizer,
        stop_ids=stop_ids,
        pad_id=pad_id,
        sample_config=sample_config,
        greedy_config=GenerationConfig(do_sample=False, max_new_tokens=args.max_new_tokens),
        checkpoint_generation_config=checkpoint_generation_config,
        train_rows=train_rows,
        eval_rows=eval_rows,
        train_prompts=[encode_prompt(tokenizer, question, args) for question, _ in train_rows],
        eval_prompts=[encode_prompt(tokenizer, question, args) for question, _ in eval_rows],
        num_iterations=args.total_steps // (args.forward_lag * args.num_epochs) if args.total_steps else args.num_iterations,
        local_prompts=local_prompts,
        local_sequences=local_sequences,
        single_pass=args.micro_batch_size == local_sequences,
        final_tv_batches=math.ceil(args.final_tv_fraction * (local_sequences // args.micro_batch_size)),
        reward_functions=reward_functions(args),
    )
    return setup, model, reference


def load_jsonl(path: str, fields: tuple[str, str] = ("question", "answer")) -> list[tuple[str, float]]:
    """(question, reference) pairs from a JSONL file with the (question, answer) `fields`, openai/gsm8k's by default;
    bad lines exit 2."""
    rows = []
    try:
        handle = open(path, "rb")
    except OSError as error:
        refuse(f"cannot read {path}: {error.strerror}")
    with handle:
        for number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                refuse(f"{path}:{number}: not UTF-8 text (byte {raw[error.start]:#04x} at column {error.start + 1})")
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                refuse(f"{path}:{number}: malformed JSON line ({error.msg})")
            rows.append(check_row(record, f"{path}:{number}", fields))
    if not rows:
        refuse(f"{path}: no rows")
    return rows


def check_row(record, where: str, fields: tuple[str, str] = ("question", "answer")) -> tuple[str, float]:
    question, answer = fields
    if not isinstance(record, dict) or not all(isinstance(record.get(k), str) for k in fields):
        refuse(f"{where}: expected an object with string fields '{question}' and '{answer}'")
    reference = reference_answer(record[answer])
    if reference is None:
        refuse(f"{where}: '{answer}' does not end in '#### <number>'")
    return record[question], reference


def hub_resolvable() -> bool:
    """Whether the hub's host name resolves. With no network this fails at once, where the hub
    clients would retry for about 30 s (printing a line per retry) before giving up."""
    try:
        socket.getaddrinfo(urllib.parse.urlparse(huggingface_hub.constants.ENDPOINT).hostname, 443)
    except OSError:
        return False
    return True


def load_split(path: Optional[str], split: str, fields: tuple[str, str] = ("question", "answer")):
    """(question, reference) pairs of a JSONL file when given, else of openai/gsm8k (config main) from the hub."""
    if path is not None:
        return load_jsonl(path, fields)
    flag = "--data-file" if split == "train" else "--eval-data-file (or --eval-every 0)"
    if not huggingface_hub.constants.HF_HUB_OFFLINE and not hub_resolvable():
        refuse(f"no network to load {GSM8K_ID}: pass a local JSONL file with {flag}, or HF_HUB_OFFLINE=1 for a cached copy")
    import datasets  # only needed for the hub data; importing it costs seconds

    try:
        dataset = datasets.load_dataset(GSM8K_ID, "main", split=split)
    except Exception as error:  # any failure here (offline, missing cache) has the same remedy
        refuse(f"could not load {GSM8K_ID} {split} split ({type(error).__name__}); pass a local JSONL file with {flag}")
    return [check_row(record, f"{GSM8K_ID} {split} row {i}", fields) for i, record in enumerate(dataset)]


def model_files(path: str) -> tuple[str, Optional[str]]:
    """A local model's folder and its GGUF file: `path` itself when it is a .gguf file, the folder's only .gguf file
    when it has no config.json (as a package that ships one GGUF file), else None (a save_pretrained folder)."""
    if os.path.isfile(path):
        return os.path.dirname(path) or ".", os.path.basename(path)
    if os.path.isfile(os.path.join(path, "config.json")):
        return path, None
    ggufs = [name for name in os.listdir(path) if name.endswith(".gguf")]
    return path, ggufs[0] if len(ggufs) == 1 else None


def load_model_and_tokenizer(model_id: str):
    """Model (fp32 weights) and tokenizer through the Auto classes, from a hub id, a save_pretrained folder or a GGUF
    file (dequantized to fp32 by transformers); one that cannot load exits 2, with the library's whole message for
    a local model (a missing tokenizer file, a truncated model.safetensors)."""
    local = looks_like_path(model_id)
    source, gguf_file = model_files(os.path.expanduser(model_id)) if local else (model_id, None)
    # With no network, a model already in the hub cache still loads, and no download is attempted.
    local_only = local or huggingface_hub.constants.HF_HUB_OFFLINE or not hub_resolvable()
    extra = {"gguf_file": gguf_file} if gguf_file else {}
    part = "tokenizer"
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=local_only, **extra)
        part = "model"
        # The GGUF reader's own progress bar (not transformers' switch) would otherwise stand in the run's log.
        with contextlib.redirect_stderr(io.StringIO()) if gguf_file else contextlib.nullcontext():
            model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32, local_files_only=local_only, **extra)
    except Exception as error:  # OSError, ValueError, safetensors' own error, ...: the file or the download failed
        if local:
            refuse(f"could not load the {part} from {os.path.join(source, gguf_file) if gguf_file else source}: {error}")
        refuse(
            f"could not load the {part} of '{model_id}' from the Hugging Face hub ({type(error).__name__}); "
            "with no network, pass a local model folder: --model-id /path/to/model"
        )
    if gguf_file:
        # The weights were dequantized to fp32 on load: an ordinary model from here on, which save_pretrained
        # writes as safetensors (it refuses a model still marked as GGUF-quantized).
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    # Dropout would make pi_theta stochastic, so r != 1 with no lag and D would measure noise (TRL does the same).
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    return model, tokenizer


def keep_output_head_fp32(model):
    """Under bf16 autocast, compute the output projection (the logits) in fp32.

    bf16 has an 8-bit mantissa: a logit near 20 is off by up to 0.06, so log pi_theta - log beta
    would carry rounding noise of the size of VACO's budget delta/2 = 0.025. Hooks (not a wrapped
    forward) so that a deep copy of the model, the lagged generator, keeps the behaviour.
    """
    saved = []

    def before(module, inputs):
        device_type = inputs[0].device.type
        saved.append(torch.is_autocast_enabled(device_type))
        torch.set_autocast_enabled(device_type, False)
        return tuple(x.float() for x in inputs)

    def after(module, inputs, output):
        torch.set_autocast_enabled(inputs[0].device.type, saved.pop())

    head = model.get_output_embeddings()
    head.register_forward_pre_hook(before)
    head.register_forward_hook(after)


def trainable_policy(model, args: Args):
    """The model that trains and the frozen reference of --beta. With --lora-r, peft's LoRA adapters on the model
    (their B initialised to 0: the initial policy is the base model's), and no reference copy: the model with its
    adapters off is the reference. Without, the model itself, and a frozen copy of it when --beta is not 0."""
    if args.lora_r:
        import peft

        warnings.filterwarnings("ignore", module=r"peft(\.|$)")  # a quiet log, as transformers' (its save's guesses)
        modules = args.lora_target_modules
        targets = modules if modules == "all-linear" else [name.strip() for name in modules.split(",")]
        config = peft.LoraConfig(r=args.lora_r, lora_alpha=args.lora_alpha, lora_dropout=0.0, target_modules=targets)
        try:
            return peft.get_peft_model(model, config), None
        except ValueError as error:  # target modules not found in the model
            refuse(f"--lora-target-modules {modules}: {error}")
    reference = copy.deepcopy(model).eval().requires_grad_(False) if args.beta else None
    return model, reference


def stop_token_ids(model, tokenizer) -> list[int]:
    eos = model.generation_config.eos_token_id
    eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    return sorted(set(eos) | {tokenizer.eos_token_id})


def encode_prompt(tokenizer, question: str, args: Optional[Args] = None) -> list[int]:
    """The question and `args.instruction` (default flags when None): through the chat template when the tokenizer
    has one and --chat-template (it adds its own special tokens), with the system prompt if any; else plain text."""
    args = args or Args()
    message = f"{question}\n{args.instruction}" if args.instruction else question
    if tokenizer.chat_template and args.chat_template:
        system = [{"role": "system", "content": args.system_prompt}] if args.system_prompt is not None else []
        text = tokenizer.apply_chat_template(
            system + [{"role": "user", "content": message}], tokenize=False, add_generation_prompt=True
        )
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    return tokenizer(f"Question: {message}\nAnswer:")["input_ids"]


def initial_state(setup: Setup, model, reference, run_name: str, run_id: Optional[str]) -> State:
    """The training state of a fresh start: the loaded model, its optimizer, the policy buffer holding it, the data
    order's generator at the seed, no history."""
    args = setup.args
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=args.learning_rate)
    return State(
        model=model,
        # Policy buffer (docs/method.md §2): the lag+1 most recent weights, the current ones included, kept
        # in host memory until drawn. With no lag the learner generates itself and no copy is kept.
        generator=copy.deepcopy(model).eval() if args.lag else model,
        optimizer=optimizer,
        policy_buffer=collections.deque([snapshot(model)], maxlen=args.lag + 1) if args.lag else None,
        data_rng=np.random.default_rng(args.seed),
        order=collections.deque(),
        run_name=run_name,
        run_id=run_id,
        reference=reference,
    )


def restore_checkpoint(setup: "Setup", state: "State", path: str):
    """--resume: the model, optimizer, policy buffer, data order, RNG states, histories and counters of the checkpoint at
    `path` (checked by check_args and again under the claim) into the fresh `state`. A checkpoint of another model
    stops here, before anything is written."""
    args = setup.args
    if path.endswith(PREVIOUS_CHECKPOINT) and setup.main_process:
        print(f"--resume: no {CHECKPOINT} (the run stopped while replacing it): continuing from {path}", flush=True)
    try:
        checkpoint = load_checkpoint(path)
        missing = {"model", "optimizer", "iteration", "world_size", "history", "counters"} - set(checkpoint)
        if missing:
            raise ValueError(f"no {', '.join(sorted(missing))}")
    except Exception as error:  # a checkpoint whose digest holds but not its content: another revision's keys
        refuse(f"--resume: {path} is damaged ({str(error).strip() or type(error).__name__})")
    mismatch = model_mismatch(state.model, checkpoint["model"])
    if mismatch:
        refuse(f"--resume: {path} holds another model than --model-id {args.model_id} ({mismatch})")
    if checkpoint["world_size"] != setup.world:
        refuse(f"--resume: the run used {checkpoint['world_size']} processes, this one {setup.world}")
    state.model.load_state_dict(checkpoint["model"])
    state.optimizer.load_state_dict(checkpoint["optimizer"])
    if args.lag:
        state.policy_buffer.clear()
        state.policy_buffer.extend(checkpoint["policy_buffer"])
    state.data_rng.bit_generator.state = checkpoint["data_rng"]
    state.order.extend(checkpoint["order"])
    set_rng_state(checkpoint["rng"][setup.rank])
    state.history, state.counters, state.wandb_id = checkpoint["history"], checkpoint["counters"], checkpoint["wandb_id"]
    state.first_iteration = checkpoint["iteration"] + 1
    state.run_name = checkpoint["run_name"]


def model_mismatch(model, saved: dict) -> Optional[str]:
    """The first entry where a checkpoint's model and the loaded one differ in name or shape."""
    ours = {key: tuple(value.shape) for key, value in model.state_dict().items()}
    theirs = {key: tuple(getattr(value, "shape", ())) for key, value in saved.items()}
    for key in sorted(ours.keys() | theirs.keys()):
        if ours.get(key) != theirs.get(key):
            return f"{key}: {theirs.get(key, 'absent')} in the checkpoint, {ours.get(key, 'absent')} in the model"
    return None


def run_has_finished(setup: Setup, state: State) -> bool:
    """--resume of a run that did all its iterations and wrote summary.json: it stays as it is (nothing is evaluated or
    written again). Without summary.json (killed after its last checkpoint) the run's end is still to do."""
    done = state.first_iteration - 1
    if done < setup.num_iterations:
        return False
    if not os.path.exists(os.path.join(setup.run_dir, SUMMARY_FILE)):
        if setup.main_process:
            print(f"--resume: all {done} iterations are done; writing the run's end", flush=True)
        return False
    if setup.main_process:
        print(
            f"--resume: the run in {setup.run_dir} is finished ({done} iterations done, {setup.num_iterations} asked): "
            "nothing to do (a larger --num-iterations or --total-steps continues it)",
            flush=True,
        )
    if setup.distributed:
        torch.distributed.destroy_process_group()
    return True


def write_run_start(setup: Setup, state: State, claim: Claim):
    """The main process's start in its claimed folder: wandb first (a failure leaves the folder untouched), then for a
    fresh start or --overwrite run.json and args.json (a resume keeps the run's own), TensorBoard, the memory line."""
    args, run_dir = setup.args, setup.run_dir
    if not setup.main_process:
        return
    if args.track:
        start_wandb(setup, state)
    try:
        if not args.resume:
            write_run_files(setup, state, claim)
        # purge_step drops anything logged after the checkpoint by the interrupted run (a restart: everything).
        purge_step = 0 if setup.restart else state.counters["global_step"] + 1 if args.resume else None
        before = set(os.listdir(run_dir))
        setup.writer = (WandbWriter if args.track else SummaryWriter)(run_dir, purge_step=purge_step)
        for name in set(os.listdir(run_dir)) - before:  # TensorBoard's events file of this start
            claim.written.add(name)
            record_written(run_dir, name)
        if not args.resume or setup.restart:
            setup.writer.add_text(
                "hyperparameters",
                "|param|value|\n|-|-|\n%s" % ("\n".join([f"|{key}|{value}|" for key, value in vars(args).items()])),
            )
        setup.writer.flush()  # a full disk shows here, while the start can still be undone
    except OSError as error:
        refuse(f"cannot write {error.filename or run_dir}: {error.strerror or error}")
    if args.track and args.resume and not setup.restart:
        replay_to_wandb(run_dir, state.counters["global_step"])
    print(f"run folder: {run_dir}", flush=True)
    # --cuda (the default) takes a GPU where torch sees one: say which device it is, so a job never holds one unused.
    name = f" ({torch.cuda.get_device_name(setup.device)})" if setup.device.type == "cuda" else ""
    print(f"device: {setup.device}{name}" + (" (--cuda: torch sees no CUDA device)" if args.cuda and not name else ""))
    widest = max(len(p) for p in setup.train_prompts)
    sequences = args.generation_batch_size or args.forward_lag * setup.local_sequences
    print(memory_estimate(state.model, args, sequences, widest, setup.use_bf16), flush=True)


def start_wandb(setup: Setup, state: State):
    """--track: the wandb run (the same one on a resume). A missing login or network is one line and exit 2."""
    import wandb

    args = setup.args
    try:
        wandb.init(
            project=args.wandb_project_name,
            entity=args.wandb_entity,
            config=vars(args),
            name=state.run_name,
            save_code=True,
            # Every start continues one wandb run, one killed before its first checkpoint included (a sweep's agent
            # sets its own id, WANDB_RUN_ID).
            id=state.wandb_id or state.run_id,
            resume="allow",
        )
    except Exception as error:  # wandb's UsageError, CommError, ...: the remedy is the same
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        refuse(f"--track: wandb could not start ({reason}); run wandb login or set WANDB_MODE=offline")
    state.wandb_id = wandb.run.id
    wandb.define_metric("*", step_metric="global_step")


def write_run_files(setup: Setup, state: State, claim: Claim):
    """A fresh start's run.json (which makes the folder a run) and args.json; --overwrite first removes the old run's
    entries (the lock stays: this process holds it)."""
    args, run_dir = setup.args, setup.run_dir
    if args.overwrite:  # the old run's entries: the files its run.json records, not others named like them
        recorded = read_run_record(run_dir).get("files") if os.path.exists(os.path.join(run_dir, RUN_FILE)) else []
        for name in os.listdir(run_dir):
            if name != LOCK_FILE and written_by_a_run(run_dir, name, recorded):
                remove_entry(os.path.join(run_dir, name))
    claim.written |= {RUN_FILE, ARGS_FILE}
    created = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    saved = {name: stored(name, v) for name, v in dataclasses.asdict(args).items()}
    description = {"script": SCRIPT, "format": RUN_FORMAT, "run_id": state.run_id, "created": created, "files": []}
    description["wandb_id"] = state.wandb_id
    write_json(os.path.join(run_dir, RUN_FILE), {**description, "args_sha256": args_digests(saved)})
    write_json(os.path.join(run_dir, ARGS_FILE), saved)


def write_atomically(path: str, write, previous: Optional[str] = None):
    """`write(handle)` into path + ".tmp", flushed and fsynced, then renamed over `path`: a reader, or a start after a
    kill or a full disk, finds the old file or the new one, never a part of one. With `previous`, the file replaced
    is kept under that name. On any failure the .tmp goes; an OSError names `path`."""
    temporary = path + ".tmp"
    try:
        fd = open_own_file(temporary, os.O_WRONLY | os.O_CREAT)
    except OSError as error:  # a link is left as it is
        error.filename = path
        raise
    try:
        with open(fd, "wb") as handle:
            handle.truncate()  # what a killed write left
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        if previous and os.path.exists(path):
            os.replace(path, previous)
        os.replace(temporary, path)
    except BaseException as error:
        with contextlib.suppress(OSError):
            os.remove(temporary)
        if isinstance(error, OSError):
            error.filename = path
        raise


def write_json(path: str, value):
    write_atomically(path, lambda handle: handle.write(json.dumps(value, indent=2).encode() + b"\n"))


def memory_estimate(model, args: Args, sequences: int, prompt_length: int, bf16: bool) -> str:
    """A start-up line: what the weights, gradients and Adam's moments (of the trainable weights), a lagged generator,
    the reference of --beta, the KV cache, the logits and the activations a training pass keeps for its backward need.
    Activations: per token and layer of a micro-batch, 8 x hidden + 4 x intermediate + 4 x key-value width numbers
    (within 3% of what autograd keeps for SmolLM2-135M and the tiny test model); with --gradient-checkpointing, each
    layer's input and one layer's activations."""
    gib = 2**-30
    params = sum(p.numel() for p in model.parameters())
    trainable = 4 * sum(p.numel() for p in model.parameters() if p.requires_grad)
    config = model.config
    heads, layers, hidden = config.num_attention_heads, config.num_hidden_layers, config.hidden_size
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    length = prompt_length + args.max_new_tokens
    width = 2 if bf16 else 4
    kv_cache = 2 * layers * kv_heads * head_dim * width * sequences * length
    logits = 3 * 4 * args.micro_batch_size * (args.max_new_tokens + 1) * config.vocab_size  # logits, softmax, gradient
    per_layer = 8 * hidden + 4 * getattr(config, "intermediate_size", 4 * hidden) + 4 * kv_heads * head_dim
    kept = hidden * layers + per_layer if args.gradient_checkpointing else per_layer * layers
    activations = width * args.micro_batch_size * length * kept
    weights = 4 * params
    copies = weights * (bool(args.lag) + bool(args.beta and not args.lora_r))  # lagged generator, reference
    device = weights + 3 * trainable + copies + kv_cache + logits + activations
    return (
        f"memory estimate per process: device {device * gib:.1f} GiB = weights {weights * gib:.2f} + gradients "
        f"{trainable * gib:.2f} + Adam {2 * trainable * gib:.2f} + lagged generator and reference {copies * gib:.2f} "
        f"+ KV cache {kv_cache * gib:.2f} ({sequences} x {length} tokens) + logits {logits * gib:.2f} + activations "
        f"{activations * gib:.2f} ({args.micro_batch_size} x {length} tokens); host "
        f"{(args.lag + 1) * weights * gib * bool(args.lag):.2f} GiB of policy buffer"
    )


# ---------------------------------------------------------------- signals and checkpoints


def stop_on_signals():
    """SIGINT (Ctrl-C) and SIGTERM (e.g. preemption) stop the run after the current iteration, which then saves what
    it was asked to; the returned list receives the signal. A second signal stops the run at once, saving nothing."""
    received = []

    def handler(signum, frame):
        received.append(signum)
        signal.signal(signum, signal.SIG_DFL)
        name = signal.Signals(signum).name
        print(f"\n{name}: stopping after this iteration (send it again to stop now)", flush=True)

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    return received


def save_checkpoint(setup: Setup, state: State, iteration: int):
    """<run_dir>/checkpoint.pt after `iteration`: everything the rest of the run depends on, every rank's RNG states."""
    begin = time.perf_counter()
    rng_states = [None] * setup.world
    if setup.distributed:
        torch.distributed.all_gather_object(rng_states, rng_state())
    else:
        rng_states[0] = rng_state()
    if not setup.main_process:
        return
    checkpoint = {
        "model": state.model.state_dict(),
        "optimizer": state.optimizer.state_dict(),
        "policy_buffer": list(state.policy_buffer) if setup.args.lag else None,
        "data_rng": state.data_rng.bit_generator.state,
        "order": list(state.order),
        "rng": rng_states,
        "history": state.history,
        "counters": state.counters,
        "iteration": iteration,
        "world_size": setup.world,
        "run_name": state.run_name,
        "wandb_id": state.wandb_id,
        "run_id": state.run_id,
    }
    write_checkpoint_file(os.path.join(setup.run_dir, CHECKPOINT), checkpoint)
    setup.writer.add_scalar("perf/checkpoint_seconds", time.perf_counter() - begin, state.counters["global_step"])


def write_checkpoint_file(path: str, checkpoint: dict):
    """Atomic (write_atomically), the checkpoint it replaces kept as checkpoint.prev.pt: at every moment one of
    the two is whole. A header line names the script, the run (checkpoint["run_id"]) and the SHA-256 of the torch.save
    payload after it, so that a resume refuses another run's checkpoint or a damaged one before it loads anything."""

    def write(handle):
        handle.write(b" " * (CHECKPOINT_HEADER_BYTES - 1) + b"\n")  # the header's place, filled once the digest is known
        payload = HashingWriter(handle)
        try:
            torch.save(checkpoint, payload)
        except Exception:
            if payload.error:  # a full disk, not torch's "unexpected pos" that follows it
                raise payload.error
            raise
        handle.seek(0)
        handle.write(checkpoint_header(checkpoint["run_id"], payload.sha256.hexdigest()))

    write_atomically(path, write, previous=os.path.join(os.path.dirname(path), PREVIOUS_CHECKPOINT))


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict):
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])


# ---------------------------------------------------------------- logging


# TensorBoard tags of the per-step and per-iteration records, named as in the MuJoCo scripts where
# the quantity is the same. The x-axis is the optimizer step.
STEP_TAGS = {
    "policy_loss": "losses/policy_loss",
    "approx_kl": "losses/approx_kl",
    "reference_kl": "losses/reference_kl",
    "grad_norm": "losses/grad_norm",
    "clip_fraction": "losses/clipfrac",
    "clip_ratio_low": "losses/clip_ratio_low",
    "clip_ratio_high": "losses/clip_ratio_high",
    "entropy": "losses/entropy",
    "learning_rate": "charts/learning_rate",
    "tv": "vaco/tv",
    "filter_fraction": "vaco/filter_frac",
    "filter_completion_fraction": "vaco/filter_completion_frac",
}


ITERATION_TAGS = {
    "reward": "charts/reward",
    "reward_std": "charts/reward_std",
    "reward_std_batch": "charts/reward_std_batch",
    "accuracy": "charts/accuracy",
    "format_rate": "charts/format_rate",
    "response_length": "charts/response_length",
    "response_length_min": "charts/response_length_min",
    "response_length_max": "charts/response_length_max",
    "truncated_fraction": "charts/truncated_fraction",
    "tokens_seen": "charts/num_tokens",
    "zero_std_fraction": "charts/zero_std_fraction",
    "staleness": "lag/staleness_mean",
    "tv_backward": "lag/backward_tv",
    "tv_final": "lag/final_tv",
    "over_budget_fraction": "vaco/over_budget_frac",
    "generation_tokens_per_s": "perf/generation_tokens_per_s",
    "training_tokens_per_s": "perf/training_tokens_per_s",
}


def log_step(setup: "Setup", state: "State", step: dict):
    if setup.main_process:
        for key, tag in STEP_TAGS.items():
            if key in step:
                setup.writer.add_scalar(tag, step[key], state.counters["global_step"])


def log_iteration(
    setup: "Setup", state: "State", iteration: int, rollout: dict, tokens: dict, steps: list[dict], staleness: int, final_tv
):
    """The iteration's record (its statistics, lag, divergence, throughput and phase times) into the history, to
    TensorBoard and as one line on stdout. `tokens` holds `rewards_and_advantages`'s counts and `trained`, the tokens
    of this rank's training passes."""
    args, counters = setup.args, state.counters
    counters["tokens_seen"] += int(tokens["sequences"])
    wall = time.perf_counter() - setup.iteration_start
    record = {
        "step": counters["global_step"],
        "iteration": iteration,
        **rollout,
        "tokens_seen": counters["tokens_seen"],
        "staleness": staleness,
        "tv_backward": steps[0]["tv"],
        "tv_final": final_tv,
        "generation_tokens_per_s": tokens["completions"] / setup.timers["generation"],
        "training_tokens_per_s": setup.all_reduce([float(tokens["trained"])])[0] / setup.timers["training"],
        "iteration_seconds": wall,
        "other_seconds": wall - sum(setup.timers.values()),
    }
    record.update({f"{phase}_seconds": seconds for phase, seconds in setup.timers.items()})
    if args.loss == "vaco":
        record["over_budget_fraction"] = float(np.mean([s["over_budget"] for s in steps]))
    state.history["steps"] += steps
    state.history["iterations"].append(record)
    if not setup.main_process:
        return
    for key, value in record.items():
        tag = ITERATION_TAGS.get(key) or (f"perf/{key}" if key.endswith("_seconds") else None)
        tag = tag or (key if key.startswith("rewards/") else None)  # each reward function's mean, TRL's name
        if tag and value is not None:
            setup.writer.add_scalar(tag, value, counters["global_step"])
    dropped_key = "clip_fraction" if args.loss == "ppo-clip" else "filter_fraction"
    # This process's time and, at its pace so far, the time left (the final evaluation not counted).
    elapsed = time.time() - setup.start_time
    left = elapsed / (iteration - state.first_iteration + 1) * (setup.num_iterations - iteration)
    tv_text = f"{final_tv:.4f}" if final_tv is not None else "n/a"
    print(
        f"iter {iteration}/{setup.num_iterations} step {counters['global_step']} reward {record['reward']:.3f} "
        f"acc {record['accuracy']:.3f} format {record['format_rate']:.3f} "
        f"len {record['response_length']:.0f} truncated {record['truncated_fraction']:.2f} tv_final {tv_text} "
        f"{dropped_key} {np.mean([s[dropped_key] for s in steps]):.4f} "
        f"gen {record['generation_tokens_per_s']:.0f} tok/s train {record['training_tokens_per_s']:.0f} tok/s "
        f"| elapsed {hours_minutes_seconds(elapsed)} | ETA {hours_minutes_seconds(left)}",
        flush=True,
    )


def log_completions(setup: "Setup", state: "State", iteration: int, generated: dict):
    """At the first iteration and every --log-completions-every, a sample of the generation batch, its first
    --num-completions-to-log rows (whole groups), to TensorBoard as text and to wandb as a table (as TRL's
    log_completions): what the model writes, and what the reward made of it."""
    every, count = setup.args.log_completions_every, min(setup.args.num_completions_to_log, generated["input_ids"].shape[0])
    if not setup.main_process or not count or not every or (iteration != 1 and iteration % every):
        return
    rows = take_rows(generated, slice(0, count))
    width = rows["completion_mask"].shape[1]
    prompts = [
        setup.tokenizer.decode(ids[mask.bool()].tolist(), skip_special_tokens=True)
        for ids, mask in zip(rows["input_ids"][:, :-width], rows["attention_mask"][:, :-width])
    ]
    completions = decode_completions(setup.tokenizer, rows)
    table = [
        [state.counters["global_step"], prompt, completion, float(reward), float(advantage)]
        for prompt, completion, reward, advantage in zip(prompts, completions, rows["rewards"], rows["advantages"])
    ]
    text = "\n\n".join(
        f"**{n + 1}. reward {reward:g}, advantage {advantage:+.3f}**\n\nprompt:\n\n    "
        + prompt.replace("\n", "\n    ")
        + "\n\ncompletion:\n\n    "
        + completion.replace("\n", "\n    ")
        for n, (_, prompt, completion, reward, advantage) in enumerate(table)
    )
    setup.writer.add_text("completions", text, state.counters["global_step"])
    if setup.args.track:
        import wandb

        columns = ["step", "prompt", "completion", "reward", "advantage"]
        log_to_wandb({"completions": wandb.Table(columns=columns, data=table)}, state.counters["global_step"])


NO_SIGNAL_ITERATIONS = 3  # iterations in a row where every group's rewards are equal before the run says so


def warn_if_no_signal(setup: "Setup", state: "State"):
    """Says out loud when nothing is learned: every group of the last NO_SIGNAL_ITERATIONS iterations had equal rewards,
    so every advantage is 0 and no gradient flows (GRPO learns only from a group whose completions differ)."""
    streak = 0  # the last iterations in a row with no signal
    for record in reversed(state.history["iterations"]):
        if record["zero_std_fraction"] < 1:
            break
        streak += 1
    if not setup.main_process or not streak or streak % NO_SIGNAL_ITERATIONS:  # said once per NO_SIGNAL_ITERATIONS
        return
    records = state.history["iterations"][-NO_SIGNAL_ITERATIONS:]
    reward = np.mean([r["reward"] for r in records])
    truncated = np.mean([r["truncated_fraction"] for r in records])
    formatted = np.mean([r["format_rate"] for r in records])
    print(
        f"warning: no learning signal: in each of the last {NO_SIGNAL_ITERATIONS} iterations every prompt's "
        f"{setup.args.num_generations} completions had the same reward (mean reward {reward:.3f}), so every advantage "
        f"is 0 and no gradient flows. Try more completions per prompt (--num-generations), easier problems "
        f"(--data-file), a longer completion limit (--max-new-tokens; {truncated:.0%} of completions were cut), or "
        f"an instruction the model follows (--instruction, --system-prompt; {formatted:.0%} ended with a '####' line)",
        flush=True,
    )


def hours_minutes_seconds(seconds: float) -> str:
    minutes, seconds = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{seconds:02d}"


class WandbWriter(SummaryWriter):
    """--track: TensorBoard's writer that gives each scalar to wandb as well, at the same step. The script logs to wandb
    itself rather than through wandb's TensorBoard watcher, which may not have read the last iterations when the
    process ends; wandb's own step is the global step, so a step logged again after a resume counts once."""

    def add_scalar(self, tag, scalar_value, global_step=None, *args, **kwargs):
        super().add_scalar(tag, scalar_value, global_step, *args, **kwargs)
        log_to_wandb({tag: float(scalar_value)}, global_step)


def log_to_wandb(row: dict, step: int):
    """One row to wandb at `step`; a wandb whose process ended (a signal to all the job's processes reaches it too) is
    said once and then left: TensorBoard keeps the scalars, and the next start replays what wandb lacks."""
    if WANDB_LOST:
        return
    import wandb

    try:
        wandb.log({**row, "global_step": step}, step=step)
    except Exception as error:
        WANDB_LOST.append(error)
        print(f"wandb stopped taking the run's scalars at step {step} ({type(error).__name__}); TensorBoard keeps them")


def replay_to_wandb(run_dir: str, up_to: int):
    """A resumed run gives its wandb run what TensorBoard holds up to the checkpoint's step `up_to` from wandb's own
    next step on (online: what wandb has; offline: every start's files hold the run): the scalars a start logged to
    TensorBoard but wandb did not take (it had been stopped, or it was slow to write) are then in wandb once."""
    import logging

    import wandb
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logging.getLogger("tensorboard").setLevel(logging.ERROR)  # it warns of the purge on resume, which is expected
    events = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    events.Reload()
    rows = collections.defaultdict(dict)
    for tag in events.Tags()["scalars"]:
        for event in events.Scalars(tag):
            if wandb.run.step <= event.step <= up_to:
                rows[event.step][tag] = event.value
    for step in sorted(rows):
        log_to_wandb(rows[step], step)


# ---------------------------------------------------------------- evaluation, the saved model, the end of the run


def evaluate(setup: Setup, state: State) -> str:
    """Greedy accuracy and format rate on the evaluation prompts (main process only); returns the line that says them."""
    state.model.eval()
    correct, formatted = 0, 0
    for start in range(0, len(setup.eval_prompts), setup.local_sequences):
        with setup.autocast():
            prompts = setup.eval_prompts[start : start + setup.local_sequences]
            batch = generate(state.model, prompts, setup.greedy_config, setup.stop_ids, setup.pad_id, setup.device)
        texts = decode_completions(setup.tokenizer, batch)
        for text, (_, reference) in zip(texts, setup.eval_rows[start : start + setup.local_sequences]):
            correct += is_correct(text, reference)
            formatted += extract_answer(text) is not None
    step = state.counters["global_step"]
    record = {"step": step, "accuracy": correct / len(setup.eval_rows), "format_rate": formatted / len(setup.eval_rows)}
    setup.writer.add_scalar("eval/accuracy", record["accuracy"], step)
    setup.writer.add_scalar("eval/format_rate", record["format_rate"], step)
    state.history["evals"].append(record)
    return f"eval step {step}: accuracy {record['accuracy']:.3f} format {record['format_rate']:.3f}"


def save_model(setup: Setup, state: State):
    """save_pretrained of the model (with its own generation defaults) and the tokenizer to <run_dir>/model, swapped in
    whole: written to model.tmp, then the old model/ moved to model.old and removed once model.tmp is model/. A failed
    write (a full disk) removes model.tmp and raises an OSError that names the folder."""
    folder = os.path.join(setup.run_dir, "model")
    fresh, old = folder + ".tmp", folder + ".old"
    for path in (folder, fresh, old):  # save_pretrained would write through a link, rmtree not remove it
        if os.path.islink(path):
            raise OSError(errno.ELOOP, f"{path} is a symbolic link, which a run writes nothing through", folder)
    state.model.generation_config = setup.checkpoint_generation_config
    try:
        shutil.rmtree(fresh, ignore_errors=True)
        state.model.save_pretrained(fresh)
        setup.tokenizer.save_pretrained(fresh)
    except Exception as error:  # safetensors reports a full disk as its own error type
        shutil.rmtree(fresh, ignore_errors=True)
        raise OSError(getattr(error, "errno", None), str(error).strip().splitlines()[0], folder) from error
    finally:
        state.model.generation_config = GenerationConfig(eos_token_id=setup.stop_ids, pad_token_id=setup.pad_id)
    shutil.rmtree(old, ignore_errors=True)
    if os.path.isdir(folder):
        os.rename(folder, old)
    os.rename(fresh, folder)
    shutil.rmtree(old, ignore_errors=True)
    print(f"model saved to {folder}", flush=True)


def finish(setup: Setup, state: State, interrupted: Optional[signal.Signals]):
    """The end of the run, finished or stopped by a signal: the model (--save-model), summary.json, the logs closed;
    a stopped run exits 128 + signal."""
    args = setup.args
    if setup.main_process:
        if args.save_model:
            save_model(setup, state)
        last = state.history["iterations"][-1] if state.history["iterations"] else {}
        summary = {
            "interrupted": interrupted.name if interrupted else False,
            "global_step": state.counters["global_step"],
            "iterations": len(state.history["iterations"]),
            "tokens_seen": state.counters["tokens_seen"],
            "reward": last.get("reward"),
            "tv_final": last.get("tv_final"),
            "eval_accuracy": state.history["evals"][-1]["accuracy"] if state.history["evals"] else None,
            "seconds": time.time() - setup.start_time,
        }
        write_json(os.path.join(setup.run_dir, SUMMARY_FILE), summary)
        setup.writer.close()
        if args.track:
            import wandb

            try:
                if interrupted and not WANDB_LOST:  # a sweep's agent requeues a run marked preempting
                    wandb.run.mark_preempting()
                if not WANDB_LOST:
                    wandb.finish(exit_code=128 + interrupted if interrupted else 0)
            except Exception as error:
                WANDB_LOST.append(error)
            with contextlib.suppress(Exception):  # now, not at exit: a wandb process a signal ended would be a traceback
                wandb.teardown()
            if WANDB_LOST:
                print(f"wandb's run ended with its process ({type(WANDB_LOST[0]).__name__}); a resume replays what it lacks")
    if setup.distributed and not interrupted:
        torch.distributed.destroy_process_group()
    if interrupted:
        raise SystemExit(128 + interrupted)


# ======================================================================================================================
# End of the run's plumbing.
# ======================================================================================================================


if __name__ == "__main__":
    main(parse_args())
