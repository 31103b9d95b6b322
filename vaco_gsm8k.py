"""GRPO on GSM8k with PPO-clip or VACO's filter, under forward and backward policy lag.

Reference implementation of the LLM experiment of "Align and Filter: Improving Performance in
Asynchronous On-Policy RL" (Honari, Creus Castanyer, Przystupa, Noukhovitch, Castro, Berseth;
arXiv 2603.01365, 2026). The specification is docs/method.md §4.

A causal LM answers grade-school maths questions; the reward is 1 when the number after the first
`####` of the completion equals the reference answer. Advantages are GRPO's (G completions per
prompt, group-normalised rewards, the same advantage on every token of a completion). Policy lag:

- forward lag: one generation batch of K x 32 prompts is split into K optimizer steps
  (`--forward-lag K`), so step k trains on data that is k-1 updates old;
- backward lag: `--lag L` keeps the L+1 most recent policies and generates each batch with one
  drawn from them (docs/method.md §2).

Behaviour log-probs log beta are computed once per generation batch, by a teacher-forced pass with
the generating weights at the sampling temperature, and stay frozen. Per-token ratio
r = pi_theta / beta. Losses (`--loss`):

- ppo-clip: -min(r A, clip(r, 1 - 0.2, 1 + 0.272) A) per token (asymmetric "clip-higher");
- vaco: D = 1/2 mean|r - 1| over the minibatch's completion tokens; when D > tv_threshold/2, tokens with
  A * sign(log pi_theta - log beta) > 0 are masked; loss -M r A per token, no clipping.

Token aggregation: both losses are summed over completion tokens and divided by the number of
completion tokens of the whole minibatch (all completions of its 32 prompts), so every token of a
minibatch weighs the same, whatever the length of its completion and however the minibatch is split
into micro-batches for gradient accumulation. With several micro-batches, VACO first scores the
minibatch in a no-grad pass so that every micro-batch applies the mask of the minibatch's D.

Choices of ours (docs/method.md leaves them open): default model Qwen/Qwen2.5-0.5B-Instruct; prompt
wording; 400 new tokens at most; sampling at temperature 1 from the full distribution (no top-k /
top-p, so beta is exactly the softmax the tokens were drawn from); Adam with a constant learning
rate and gradient-norm clipping at 1.0; std with Bessel's correction and eps 1e-4 as TRL; dropout
disabled; fp32 logits under bf16 autocast; `--lag-mode fixed`.

Usage:
    python vaco_gsm8k.py --loss vaco --forward-lag 4
    python vaco_gsm8k.py --model-id /path/to/model --data-file train.jsonl --eval-data-file test.jsonl
"""

import collections
import contextlib
import copy
import dataclasses
import io
import json
import math
import os
import random
import re
import socket
import sys
import time
import urllib.parse
from dataclasses import dataclass
from typing import Literal, Optional

import huggingface_hub
import numpy as np
import torch
import transformers
import tyro
from torch.utils.tensorboard import SummaryWriter
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

# Quiet logs: no download/loading/saving progress bars and no library warnings in the run's log.
transformers.utils.logging.disable_progress_bar()
transformers.utils.logging.set_verbosity_error()
huggingface_hub.utils.disable_progress_bars()


@dataclass
class Args:
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment"""
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
    run_dir: Optional[str] = None
    """folder for TensorBoard logs, args.json and the saved model (None: runs/<run_name>)"""
    save_model: bool = False
    """if toggled, save model and tokenizer with `save_pretrained` to <run_dir>/model at the end"""

    # Model and data
    model_id: str = "Qwen/Qwen2.5-0.5B-Instruct"
    """Hugging Face hub id or local folder of a causal LM (the paper's model is not public; ours)"""
    data_file: Optional[str] = None
    """training prompts as JSONL with `question` and `answer` ending in `#### N` (None: openai/gsm8k train split)"""
    eval_data_file: Optional[str] = None
    """evaluation prompts, same schema (None: openai/gsm8k test split)"""
    max_new_tokens: int = 400
    """the most tokens generated per completion (ours)"""
    temperature: float = 1.0
    """sampling temperature; behaviour and policy log-probs use the same temperature"""
    bf16: bool = True
    """bf16 autocast on CUDA (weights stay fp32); CPU always runs fp32"""
    gradient_checkpointing: bool = False
    """if toggled, recompute activations in the backward pass to save memory"""

    # Algorithm
    loss: Literal["ppo-clip", "vaco"] = "vaco"
    """policy loss: PPO-clip with clip-higher, or VACO's TV filter"""
    num_iterations: int = 100
    """number of generation batches"""
    forward_lag: int = 1
    """K: optimizer steps per generation batch (the generation batch holds K x prompts-per-step prompts)"""
    lag: int = 0
    """backward lag: generate with one of the lag+1 most recent policies (0: synchronous)"""
    lag_mode: Literal["uniform", "fixed"] = "uniform"
    """which buffered policy generates: uniform draw, or always the oldest (ours)"""
    prompts_per_step: int = 32
    """prompts per minibatch, i.e. per optimizer step (paper: 32)"""
    num_generations: int = 8
    """G: completions per prompt (paper: 8)"""
    micro_batch_size: int = 16
    """sequences per forward/backward pass (gradient accumulation); must divide prompts-per-step x G"""
    learning_rate: float = 1e-6
    """Adam learning rate, constant (paper: 1e-6)"""
    max_grad_norm: float = 1.0
    """the maximum norm for the gradient clipping (ours)"""
    clip_low: float = 0.2
    """PPO-clip lower ratio: r is clipped below at 1 - clip_low (paper: 0.2)"""
    clip_high: float = 0.272
    """PPO-clip higher ratio: r is clipped above at 1 + clip_high (paper: 0.272)"""
    tv_threshold: float = 0.05
    """VACO's TV threshold delta: the filter acts when D > delta/2 (paper: 0.05)"""
    eval_every: int = 10
    """greedy evaluation every this many iterations, plus before training and at the end (0: never)"""
    eval_size: int = 256
    """number of evaluation prompts (the first ones of the evaluation set)"""


GSM8K_ID = "openai/gsm8k"
INSTRUCTION = "Solve the problem step by step. End with the final answer on its own line, " "in the form '#### <number>'."
# TensorBoard tags of the per-step and per-iteration records, named as in the MuJoCo scripts where
# the quantity is the same. The x-axis is the optimizer step.
STEP_TAGS = {
    "policy_loss": "losses/policy_loss",
    "approx_kl": "losses/approx_kl",
    "grad_norm": "losses/grad_norm",
    "clip_fraction": "losses/clipfrac",
    "tv": "vaco/tv",
    "filter_fraction": "vaco/filter_frac",
}
ITERATION_TAGS = {
    "reward": "charts/reward",
    "accuracy": "charts/accuracy",
    "format_rate": "charts/format_rate",
    "response_length": "charts/response_length",
    "zero_std_fraction": "charts/zero_std_fraction",
    "staleness": "lag/staleness_mean",
    "tv_backward": "lag/backward_tv",
    "tv_final": "lag/final_tv",
    "over_budget_fraction": "vaco/over_budget_frac",
    "generation_tokens_per_s": "perf/generation_tokens_per_s",
    "training_tokens_per_s": "perf/training_tokens_per_s",
}
NUMBER_RE = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)")
ADV_EPS = 1e-4


def fail(message: str):
    """Bad input: one line on stderr, exit code 2."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def normalise_bool_flags(argv: list[str]) -> list[str]:
    """Rewrite wandb-sweep style `--flag=True/False` into tyro's `--flag` / `--no-flag`."""
    bools = {f.name for f in dataclasses.fields(Args) if f.type is bool}
    out = []
    for token in argv:
        name, sep, value = token.partition("=")
        key = name[2:].replace("-", "_")
        if token.startswith("--") and sep and key in bools and value.lower() in ("true", "false"):
            out.append(f"--{key.replace('_', '-')}" if value.lower() == "true" else f"--no-{key.replace('_', '-')}")
        else:
            out.append(token)
    return out


def looks_like_path(model_id: str) -> bool:
    """Hub ids are `name` or `org/name`; anything else is meant as a local folder."""
    return (
        os.path.isabs(model_id)
        or model_id.startswith(("./", "../", "~"))
        or model_id.count("/") > 1
        or model_id.endswith("/")
        or os.path.exists(model_id)
    )


def validate(args: Args) -> Optional[str]:
    positive = ["num_iterations", "forward_lag", "prompts_per_step", "micro_batch_size", "max_new_tokens", "eval_size"]
    for name in positive:
        if getattr(args, name) < 1:
            return f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}"
    if args.num_generations < 2:
        return f"--num-generations must be >= 2 (GRPO needs a group), got {args.num_generations}"
    for name in ["lag", "eval_every"]:
        if getattr(args, name) < 0:
            return f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}"
    if args.torch_threads is not None and args.torch_threads < 1:
        return f"--torch-threads must be >= 1, got {args.torch_threads}"
    sequences = args.prompts_per_step * args.num_generations
    if sequences % args.micro_batch_size:
        return (
            f"--micro-batch-size ({args.micro_batch_size}) must divide "
            f"--prompts-per-step x --num-generations ({sequences})"
        )
    for name in ["temperature", "learning_rate", "max_grad_norm", "clip_high", "tv_threshold"]:
        if not getattr(args, name) > 0:
            return f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}"
    if not 0 < args.clip_low < 1:
        return f"--clip-low must be in (0, 1), got {args.clip_low}"
    for flag, path in [("--data-file", args.data_file), ("--eval-data-file", args.eval_data_file)]:
        if path is not None and not os.path.isfile(path):
            return f"{flag} {path} does not exist"
    if looks_like_path(args.model_id) and not os.path.isdir(os.path.expanduser(args.model_id)):
        return f"--model-id {args.model_id}: no such model folder"
    return None


def parse_args(argv: Optional[list[str]] = None) -> Args:
    argv = sys.argv[1:] if argv is None else list(argv)
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            args = tyro.cli(Args, args=normalise_bool_flags(argv))
    except SystemExit as stop:
        if stop.code:  # tyro's boxed message, folded into one line
            body = captured.getvalue().split("\n", 1)[-1]  # below the top border, which repeats the title
            text = " ".join(re.sub(r"[\u2500-\u257f]", " ", body).split())
            fail(text.split(" For full helptext")[0].split(" Argument helptext")[0])
        raise
    error = validate(args)
    if error:
        fail(error)
    return args


def parse_number(text: str) -> Optional[float]:
    """The number at the start of `text`: commas, `$` and a trailing period stripped (GSM8k practice)."""
    words = text.split()
    if not words:
        return None
    token = words[0].replace(",", "").replace("$", "")
    if token.endswith("."):
        token = token[:-1]
    return float(token) if NUMBER_RE.fullmatch(token) else None


def extract_answer(completion: str) -> Optional[float]:
    """The number after the first `####` of a completion, or None (no answer in the format)."""
    _, sep, tail = completion.partition("####")
    return parse_number(tail) if sep else None


def reference_answer(answer: str) -> Optional[float]:
    """GSM8k's reference: the number after the last `####` of the `answer` field."""
    _, sep, tail = answer.rpartition("####")
    return parse_number(tail) if sep else None


def is_correct(completion: str, reference: float) -> bool:
    predicted = extract_answer(completion)
    return predicted is not None and math.isclose(predicted, reference, rel_tol=0.0, abs_tol=1e-6)


def compute_reward(completion: str, reference: float) -> float:
    """Verifiable reward (docs/method.md §4). Module level so a test can swap in another reward."""
    return float(is_correct(completion, reference))


def grpo_advantages(rewards: torch.Tensor, group_size: int) -> tuple[torch.Tensor, float]:
    """A = (R - mean_group) / (std_group + 1e-4), one value per completion.

    `rewards` holds consecutive groups of `group_size` completions of the same prompt. The std has
    Bessel's correction, as TRL's GRPOTrainer. Also returns the fraction of groups whose rewards are
    all equal: their advantages are 0 and they carry no gradient.
    """
    grouped = rewards.view(-1, group_size)
    mean = grouped.mean(dim=1, keepdim=True)
    std = grouped.std(dim=1, keepdim=True)
    advantages = (grouped - mean) / (std + ADV_EPS)
    return advantages.flatten(), (std == 0).float().mean().item()


def tv_estimate(log_ratio: torch.Tensor) -> float:
    """D = 1/2 mean|r - 1| over tokens, the sample estimate of TV(pi_theta, beta) (docs/method.md §1)."""
    return 0.5 * (log_ratio.exp() - 1).abs().mean().item()


def ppo_clip_loss(
    logp: torch.Tensor, logp_behaviour: torch.Tensor, advantages: torch.Tensor, clip_low: float, clip_high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token PPO-clip with asymmetric clipping: -min(r A, clip(r, 1 - low, 1 + high) A).

    All arguments are 1-D over completion tokens. Returns the per-token loss and which tokens are
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


def completion_logprobs(
    model, input_ids: torch.Tensor, attention_mask: torch.Tensor, num_completion: int, temperature: float
) -> torch.Tensor:
    """log softmax(logits / temperature) of the tokens in the last `num_completion` columns, shape [B, C].

    Position ids follow the attention mask (left padding), exactly as `generate` builds them, so a
    teacher-forced pass scores the tokens with the positions they were generated at. Logits are kept
    for the completion positions only, and each row's log-probs are a gather minus a logsumexp, so
    no full-vocabulary log-softmax of the batch is materialised.
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
    rows = []
    for row_logits, row_targets in zip(logits, targets):
        row_logits = row_logits.float() / temperature
        picked = row_logits.gather(-1, row_targets[:, None]).squeeze(-1)
        rows.append(picked - torch.logsumexp(row_logits, dim=-1))
    return torch.stack(rows)


def load_jsonl(path: str) -> list[tuple[str, float]]:
    """(question, reference) pairs from a JSONL file in openai/gsm8k's schema; bad lines exit 2."""
    rows = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                fail(f"{path}:{number}: malformed JSON line ({error.msg})")
            rows.append(check_row(record, f"{path}:{number}"))
    if not rows:
        fail(f"{path}: no rows")
    return rows


def check_row(record, where: str) -> tuple[str, float]:
    fields_ok = isinstance(record, dict) and all(isinstance(record.get(k), str) for k in ("question", "answer"))
    if not fields_ok:
        fail(f"{where}: expected an object with string fields 'question' and 'answer'")
    reference = reference_answer(record["answer"])
    if reference is None:
        fail(f"{where}: 'answer' does not end in '#### <number>'")
    return record["question"], reference


def hub_resolvable() -> bool:
    """Whether the hub's host name resolves. With no network this fails at once, where the hub
    clients would retry for about 30 s (printing a line per retry) before giving up."""
    try:
        socket.getaddrinfo(urllib.parse.urlparse(huggingface_hub.constants.ENDPOINT).hostname, 443)
    except OSError:
        return False
    return True


def load_split(path: Optional[str], split: str) -> list[tuple[str, float]]:
    """A JSONL file when given, else openai/gsm8k (config main) from the hub."""
    if path is not None:
        return load_jsonl(path)
    flag = "--data-file" if split == "train" else "--eval-data-file (or --eval-every 0)"
    if not huggingface_hub.constants.HF_HUB_OFFLINE and not hub_resolvable():
        fail(f"no network to load {GSM8K_ID}: pass a local JSONL file with {flag}, or HF_HUB_OFFLINE=1 for a cached copy")
    import datasets  # only needed for the hub data; importing it costs seconds

    try:
        dataset = datasets.load_dataset(GSM8K_ID, "main", split=split)
    except Exception as error:  # any failure here (offline, missing cache) has the same remedy
        fail(f"could not load {GSM8K_ID} {split} split ({type(error).__name__}); pass a local JSONL file with {flag}")
    return [check_row(record, f"{GSM8K_ID} {split} row {i}") for i, record in enumerate(dataset)]


def load_model_and_tokenizer(model_id: str):
    """Model (fp32 weights) and tokenizer through the Auto classes; a hub id that cannot load exits 2."""
    local = looks_like_path(model_id)
    source = os.path.expanduser(model_id) if local else model_id
    # With no network, a model already in the hub cache still loads, and no download is attempted.
    local_only = local or huggingface_hub.constants.HF_HUB_OFFLINE or not hub_resolvable()
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=local_only)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32, local_files_only=local_only)
    except (OSError, ValueError) as error:
        if local:
            fail(f"could not load a model from {source}: {error}".splitlines()[0])
        fail(
            f"could not load '{model_id}' from the Hugging Face hub ({type(error).__name__}); "
            "with no network, pass a local model folder: --model-id /path/to/model"
        )
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


def stop_token_ids(model, tokenizer) -> list[int]:
    eos = model.generation_config.eos_token_id
    eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    return sorted(set(eos) | {tokenizer.eos_token_id})


def encode_prompt(tokenizer, question: str) -> list[int]:
    """The chat template when the tokenizer has one (it adds its own special tokens), else plain text."""
    message = f"{question}\n{INSTRUCTION}"
    if tokenizer.chat_template:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": message}], tokenize=False, add_generation_prompt=True
        )
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    return tokenizer(f"Question: {message}\nAnswer:")["input_ids"]


def left_pad(sequences: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, sequence in enumerate(sequences):
        ids[row, width - len(sequence) :] = torch.tensor(sequence, dtype=torch.long)
        mask[row, width - len(sequence) :] = 1
    return ids, mask


@torch.no_grad()
def generate(model, prompts: list[list[int]], config: GenerationConfig, stop_ids: list[int], pad_id: int, device):
    """Completions for left-padded prompts: dict of input_ids / attention_mask [B, P + C] and completion_mask [B, C].

    A completion runs up to and including its first stop token; later columns are padding.
    """
    prompt_ids, prompt_mask = left_pad(prompts, pad_id)
    prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device)
    output = model.generate(input_ids=prompt_ids, attention_mask=prompt_mask, generation_config=config)
    completion = output[:, prompt_ids.shape[1] :]
    is_stop = torch.isin(completion, torch.tensor(stop_ids, device=device))
    completion_mask = (is_stop.long().cumsum(-1) - is_stop.long()) == 0
    completion = completion.masked_fill(~completion_mask, pad_id)
    return {
        "input_ids": torch.cat([prompt_ids, completion], dim=1),
        "attention_mask": torch.cat([prompt_mask, completion_mask.long()], dim=1),
        "completion_mask": completion_mask,
    }


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


def score(model, batch: dict, micro_batch_size: int, temperature: float, autocast) -> list[torch.Tensor]:
    """No-grad log-probs of the completion tokens, one 1-D tensor per micro-batch."""
    out = []
    with torch.no_grad(), autocast():
        for _, ids, mask, completion_mask in micro_batches(batch, micro_batch_size):
            logp = completion_logprobs(model, ids, mask, completion_mask.shape[1], temperature)
            out.append(logp[completion_mask])
    return out


def decode_completions(tokenizer, batch: dict) -> list[str]:
    num_completion = batch["completion_mask"].shape[1]
    return tokenizer.batch_decode(batch["input_ids"][:, -num_completion:].tolist(), skip_special_tokens=True)


def train(args: Args) -> dict:
    """Run the experiment; returns the per-step, per-iteration and evaluation histories."""
    run_name = f"gsm8k__{args.exp_name}__{args.loss}__{args.seed}__{int(time.time())}"
    run_dir = args.run_dir or os.path.join("runs", run_name)

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    if args.torch_threads is not None:
        torch.set_num_threads(args.torch_threads)

    # Inputs first, so bad data stops the run before any model is loaded.
    train_rows = load_split(args.data_file, "train")
    eval_rows = load_split(args.eval_data_file, "test")[: args.eval_size] if args.eval_every > 0 else []
    model, tokenizer = load_model_and_tokenizer(args.model_id)

    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "args.json"), "w") as handle:
        json.dump(dataclasses.asdict(args), handle, indent=2)
    if args.track:
        import wandb

        wandb.tensorboard.patch(root_logdir=run_dir)
        wandb.init(
            project=args.wandb_project_name,
            entity=args.wandb_entity,
            config=vars(args),
            name=run_name,
            save_code=True,
        )
    writer = SummaryWriter(run_dir)
    writer.add_text(
        "hyperparameters",
        "|param|value|\n|-|-|\n%s" % ("\n".join([f"|{key}|{value}|" for key, value in vars(args).items()])),
    )

    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    use_bf16 = args.bf16 and device.type == "cuda"

    def autocast():
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=use_bf16)

    def synchronize():
        if device.type == "cuda":
            torch.cuda.synchronize()

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
    greedy_config = GenerationConfig(do_sample=False, max_new_tokens=args.max_new_tokens)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.learning_rate)

    train_prompts = [encode_prompt(tokenizer, question) for question, _ in train_rows]
    eval_prompts = [encode_prompt(tokenizer, question) for question, _ in eval_rows]
    data_rng = np.random.default_rng(args.seed)
    order = collections.deque()

    # Policy buffer (docs/method.md §2): the lag+1 most recent weights, the current ones included.
    # With no lag the learner generates itself and no copy is kept.
    policy_buffer = collections.deque([copy.deepcopy(model.state_dict())], maxlen=args.lag + 1) if args.lag else None
    generator = copy.deepcopy(model).eval() if args.lag else model

    G = args.num_generations
    single_pass = args.micro_batch_size == args.prompts_per_step * G  # a minibatch is one micro-batch
    history = {"steps": [], "iterations": [], "evals": []}
    global_step = 0

    def evaluate():
        model.eval()
        correct, formatted = 0, 0
        chunk = args.prompts_per_step * G
        for start in range(0, len(eval_prompts), chunk):
            with autocast():
                batch = generate(model, eval_prompts[start : start + chunk], greedy_config, stop_ids, pad_id, device)
            texts = decode_completions(tokenizer, batch)
            for text, (_, reference) in zip(texts, eval_rows[start : start + chunk]):
                correct += is_correct(text, reference)
                formatted += extract_answer(text) is not None
        record = {"step": global_step, "accuracy": correct / len(eval_rows), "format_rate": formatted / len(eval_rows)}
        writer.add_scalar("eval/accuracy", record["accuracy"], global_step)
        writer.add_scalar("eval/format_rate", record["format_rate"], global_step)
        print(f"eval step {global_step}: accuracy {record['accuracy']:.3f} format {record['format_rate']:.3f}")
        history["evals"].append(record)

    if eval_rows:
        evaluate()
    start_time = time.time()
    for iteration in range(1, args.num_iterations + 1):
        # Choose the generating policy (backward lag).
        staleness = 0
        if args.lag:
            index = 0 if args.lag_mode == "fixed" else random.randrange(len(policy_buffer))
            staleness = len(policy_buffer) - 1 - index
            generator.load_state_dict(policy_buffer[index])

        # Generate K minibatches of prompts_per_step prompts x G completions.
        model.eval()
        synchronize()
        generation_start = time.time()
        minibatches = []
        for _ in range(args.forward_lag):
            while len(order) < args.prompts_per_step:
                order.extend(data_rng.permutation(len(train_rows)).tolist())
            indices = [order.popleft() for _ in range(args.prompts_per_step)]
            prompts = [train_prompts[i] for i in indices for _ in range(G)]
            with autocast():
                batch = generate(generator, prompts, sample_config, stop_ids, pad_id, device)
            batch["references"] = [train_rows[i][1] for i in indices for _ in range(G)]
            minibatches.append(batch)
        synchronize()
        generation_time = time.time() - generation_start

        # Rewards and GRPO advantages; behaviour log-probs from the generating weights, frozen from here on.
        rewards, accuracy, formatted, lengths, zero_std = [], [], [], [], []
        for batch in minibatches:
            texts = decode_completions(tokenizer, batch)
            batch_rewards = torch.tensor(
                [compute_reward(text, ref) for text, ref in zip(texts, batch["references"])], dtype=torch.float32
            )
            batch["advantages"], zero_std_fraction = grpo_advantages(batch_rewards, G)
            batch["advantages"] = batch["advantages"].to(device)
            batch["logp_behaviour"] = score(generator, batch, args.micro_batch_size, args.temperature, autocast)
            rewards.append(batch_rewards)
            accuracy += [is_correct(text, ref) for text, ref in zip(texts, batch["references"])]
            formatted += [extract_answer(text) is not None for text in texts]
            lengths.append(batch["completion_mask"].sum(1).float().cpu())
            zero_std.append(zero_std_fraction)
        generated_tokens = int(torch.cat(lengths).sum())

        # K optimizer steps, one per minibatch: forward lag k - 1 at step k.
        model.train()
        synchronize()
        training_start = time.time()
        training_tokens = 0
        steps = []
        for k, batch in enumerate(minibatches):
            num_tokens = int(batch["completion_mask"].sum())
            over_budget = False
            if args.loss == "vaco" and not single_pass:
                # D is a statistic of the whole minibatch, but gradients accumulate micro-batch by
                # micro-batch: score the minibatch first (one no-grad pass) so all use the same mask.
                current = score(model, batch, args.micro_batch_size, args.temperature, autocast)
                over_budget = tv_estimate(torch.cat(current) - torch.cat(batch["logp_behaviour"])) > args.tv_threshold / 2
            optimizer.zero_grad(set_to_none=True)
            sums = collections.Counter()
            for j, (rows, ids, mask, completion_mask) in enumerate(micro_batches(batch, args.micro_batch_size)):
                with autocast():
                    logp = completion_logprobs(model, ids, mask, completion_mask.shape[1], args.temperature)
                logp = logp[completion_mask]
                logp_behaviour = batch["logp_behaviour"][j]
                advantages = batch["advantages"][rows][:, None].expand_as(completion_mask)[completion_mask]
                log_ratio = logp.detach() - logp_behaviour
                if args.loss == "ppo-clip":
                    per_token, dropped = ppo_clip_loss(logp, logp_behaviour, advantages, args.clip_low, args.clip_high)
                else:
                    if single_pass:
                        over_budget = tv_estimate(log_ratio) > args.tv_threshold / 2
                    per_token, dropped = vaco_loss(logp, logp_behaviour, advantages, over_budget)
                loss = per_token.sum() / num_tokens
                if not torch.isfinite(loss):
                    raise SystemExit(f"error: non-finite loss at iteration {iteration}, minibatch {k + 1}; stopping")
                loss.backward()
                ratio = log_ratio.exp()
                sums["loss"] += loss.item()
                sums["abs_dev"] += (ratio - 1).abs().sum().item()
                sums["approx_kl"] += ((ratio - 1) - log_ratio).sum().item()
                sums["dropped"] += dropped.sum().item()
                training_tokens += int(mask.sum())
            grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm))
            if not math.isfinite(grad_norm):
                raise SystemExit(f"error: non-finite gradient at iteration {iteration}, minibatch {k + 1}; stopping")
            optimizer.step()
            global_step += 1

            step = {
                "step": global_step,
                "iteration": iteration,
                "position": k + 1,
                "policy_loss": sums["loss"],
                "tv": 0.5 * sums["abs_dev"] / num_tokens,
                "approx_kl": sums["approx_kl"] / num_tokens,
                "grad_norm": grad_norm,
            }
            if args.loss == "ppo-clip":
                step["clip_fraction"] = sums["dropped"] / num_tokens
            else:
                step["filter_fraction"] = sums["dropped"] / num_tokens
                step["over_budget"] = float(over_budget)
            for key, tag in STEP_TAGS.items():
                if key in step:
                    writer.add_scalar(tag, step[key], global_step)
            steps.append(step)
        synchronize()
        training_time = time.time() - training_start

        # Final divergence of the generation batch after its last update (the paper's TV plot).
        model.eval()
        final_log_ratio = torch.cat(
            [
                torch.cat(score(model, batch, args.micro_batch_size, args.temperature, autocast))
                - torch.cat(batch["logp_behaviour"])
                for batch in minibatches
            ]
        )
        if args.lag:
            policy_buffer.append(copy.deepcopy(model.state_dict()))

        record = {
            "step": global_step,
            "iteration": iteration,
            "reward": torch.cat(rewards).mean().item(),
            "accuracy": float(np.mean(accuracy)),
            "format_rate": float(np.mean(formatted)),
            "response_length": torch.cat(lengths).mean().item(),
            "zero_std_fraction": float(np.mean(zero_std)),
            "staleness": staleness,
            "tv_backward": steps[0]["tv"],
            "tv_final": tv_estimate(final_log_ratio),
            "generation_tokens_per_s": generated_tokens / generation_time,
            "training_tokens_per_s": training_tokens / training_time,
        }
        if args.loss == "vaco":
            record["over_budget_fraction"] = float(np.mean([s["over_budget"] for s in steps]))
        for key, tag in ITERATION_TAGS.items():
            if key in record:
                writer.add_scalar(tag, record[key], global_step)
        history["steps"] += steps
        history["iterations"].append(record)
        dropped_key = "clip_fraction" if args.loss == "ppo-clip" else "filter_fraction"
        print(
            f"iter {iteration}/{args.num_iterations} step {global_step} reward {record['reward']:.3f} "
            f"acc {record['accuracy']:.3f} format {record['format_rate']:.3f} len {record['response_length']:.0f} "
            f"tv_final {record['tv_final']:.4f} {dropped_key} {np.mean([s[dropped_key] for s in steps]):.4f} "
            f"gen {record['generation_tokens_per_s']:.0f} tok/s train {record['training_tokens_per_s']:.0f} tok/s "
            f"({time.time() - start_time:.0f} s)"
        )

        if eval_rows and (iteration % args.eval_every == 0 or iteration == args.num_iterations):
            evaluate()

    if args.save_model:
        model.generation_config = checkpoint_generation_config
        model.save_pretrained(os.path.join(run_dir, "model"))
        tokenizer.save_pretrained(os.path.join(run_dir, "model"))
        print(f"model saved to {os.path.join(run_dir, 'model')}")
    writer.close()
    if args.track:
        wandb.finish()
    return history


if __name__ == "__main__":
    train(parse_args())
