"""Tests for vaco_gsm8k.py, fully offline: a tiny random causal LM and a character-level tokenizer
built in code (tools/tiny_gsm8k.py), saved to a temp folder and loaded through the
script's own loading path, and a GSM8k-schema JSONL written by the tests."""

import copy
import dataclasses
import glob
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers is imported: nothing from the hub
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import huggingface_hub
import pytest
import torch
from transformers import GenerationConfig

ROOT = Path(__file__).resolve().parents[1]

import vaco_gsm8k as V  # noqa: E402
from tools.tiny_gsm8k import PROBLEMS, digit_fraction, write_gsm8k_jsonl, write_tiny_model  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """Tiny Llama and Qwen2 model folders and a train JSONL."""
    folder = tmp_path_factory.mktemp("tiny_gsm8k")
    return {
        "llama": write_tiny_model(folder / "llama", "llama"),
        "qwen2": write_tiny_model(folder / "qwen2", "qwen2"),
        "data": write_gsm8k_jsonl(folder / "train.jsonl"),
    }


def tiny_args(tiny, tmp_path, **overrides) -> V.Args:
    settings = dict(
        model_id=tiny["llama"],
        data_file=tiny["data"],
        run_dir=str(tmp_path / "run"),
        eval_every=0,
        num_iterations=1,
        prompts_per_step=4,
        num_generations=8,
        micro_batch_size=32,
        max_new_tokens=12,
        learning_rate=3e-3,
        torch_threads=1,
        overwrite=True,
    )
    settings.update(overrides)
    return V.Args(**settings)


@pytest.fixture
def toy_reward(monkeypatch):
    """GSM8k rewards are all 0 for a random model (no gradient at all): train on digit_fraction instead."""
    monkeypatch.setattr(V, "compute_reward", digit_fraction)


# ---------------------------------------------------------------- reward


# The reward battery: (completion, reference, reward, strict `####` answer or None). The rules are
# docs/method.md §4: the last `####` line that holds a number, else the last \boxed{}, else the last number.
BATTERY = [
    # plain GSM8k format
    ("so the total is 42.\n#### 42", 42, 1.0, 42.0),
    ("#### 1,234", 1234, 1.0, 1234.0),
    ("####1,234,567", 1234567, 1.0, 1234567.0),
    ("#### 1072.0", 1072, 1.0, 1072.0),
    ("#### 1071", 1072, 0.0, 1071.0),
    # markdown and LaTeX decoration
    ("#### **18**", 18, 1.0, 18.0),
    ("#### *18*", 18, 1.0, 18.0),
    ("#### `18`", 18, 1.0, 18.0),
    ("#### \\boxed{18}", 18, 1.0, 18.0),
    ("#### $\\boxed{18}$", 18, 1.0, 18.0),
    ("#### \\(18\\)", 18, 1.0, 18.0),
    ("#### **Final answer: 18**", 18, 1.0, 18.0),
    ("#### Answer: 18", 18, 1.0, 18.0),
    ("#### The answer is 18", 18, 1.0, 18.0),
    # units, currency, percent
    ("#### $18", 18, 1.0, 18.0),
    ("#### \\$18", 18, 1.0, 18.0),
    ("#### $1,000.00", 1000, 1.0, 1000.0),
    ("#### 18%", 18, 1.0, 18.0),
    ("####   7 apples", 7, 1.0, 7.0),
    ("#### 60 km", 60, 1.0, 60.0),
    ("#### 1,000", 1000, 1.0, 1000.0),
    # decimals and signs
    ("#### 3.50", 3.5, 1.0, 3.5),
    ("#### .5", 0.5, 1.0, 0.5),
    ("#### 18.", 18, 1.0, 18.0),
    ("#### -5", -5, 1.0, -5.0),
    ("#### \u22125", -5, 1.0, -5.0),  # a typographic minus sign
    ("#### +5", 5, 1.0, 5.0),
    ("#### 0.333", 1 / 3, 0.0, 0.333),  # compared to 1e-6: rounding is not the answer
    # an equation on the answer line: the value after the last =
    ("#### 3 + 4 = 7", 7, 1.0, 7.0),
    ("#### 12 * 3 = $36", 36, 1.0, 36.0),
    # several #### and markdown headings: the last #### line holding a number counts
    ("#### 12\n#### 13", 13, 1.0, 13.0),
    ("#### 5 then\n#### 1072", 1072, 1.0, 1072.0),
    ("#### Step 1\n3 + 4 = 7\n#### Step 2\n7 * 2 = 14\n#### 14", 14, 1.0, 14.0),
    ("#### Step 1: add\n3 + 4 = 7\n\n#### Final answer\n**7**", 7, 1.0, None),  # no number on a #### line
    ("#### 7\n#### Step 2 was wrong", 7, 1.0, 7.0),
    # no #### at all: the last \boxed{}, else the last number of the text
    ("the answer is 12", 12, 1.0, None),
    ("The answer is **18**.", 18, 1.0, None),
    ("So she has \\boxed{1,234} pens, 5 boxes.", 1234, 1.0, None),
    ("\\boxed{3} first, then \\boxed{4}", 4, 1.0, None),
    ("She pays $1,000 in total.", 1000, 1.0, None),
    ("no numbers here", 0, 0.0, None),
    ("", 0, 0.0, None),
    # not numbers
    ("#### ", 0, 0.0, None),
    ("#### twelve", 12, 0.0, None),
    ("#### inf", 0, 0.0, None),
    ("#### 1e5", 100000, 0.0, None),
    ("#### 1_000", 1000, 0.0, None),
    ("#### 3.5.2", 3.5, 0.0, None),
    # a `####` answer that is not a number is not graded by a piece of it, nor is a fraction in the text
    ("#### 3/4", 4, 0.0, None),
    ("#### 3/4", 3, 0.0, None),
    ("#### 3,5", 5, 0.0, None),
    ("#### 4,2", 2, 0.0, None),
    ("She ate 3/4 of it", 4, 0.0, None),
    ("the pairs are 1,5 and 2,6", 6, 0.0, None),
]


@pytest.mark.parametrize("completion, reference, reward, strict", BATTERY)
def test_reward_battery(completion, reference, reward, strict):
    assert V.compute_reward(completion, reference) == reward
    assert V.extract_answer(completion) == (None if strict is None else pytest.approx(strict))


def test_reward_battery_size():
    assert len(BATTERY) >= 40


# The graders the field uses, for comparison: lm-evaluation-harness's GSM8k filters (tasks/gsm8k/gsm8k.yaml: strict
# match, flexible extract and the exact-match normalisation), and math-verify (TRL's and open-r1's accuracy reward).
LM_EVAL_IGNORE = [",", r"\$", r"(?s).*#### ", r"\.$"]


def lm_eval_match(extracted, reference) -> bool:
    target = str(int(reference)) if float(reference).is_integer() else repr(float(reference))
    normalised = []
    for text in (extracted, target):
        for pattern in LM_EVAL_IGNORE:
            text = re.sub(pattern, "", text)
        normalised.append(text.lower().strip())
    return extracted is not None and normalised[0] == normalised[1]


def lm_eval_strict(completion, reference) -> bool:
    found = re.findall(r"#### (\-?[0-9\.\,]+)", completion)
    return bool(found) and lm_eval_match(found[0], reference)


def lm_eval_flexible(completion, reference) -> bool:
    found = re.findall(r"(-?[$0-9.,]{2,})|(-?[0-9]+)", completion)
    return bool(found) and lm_eval_match(found[-1][0] or found[-1][1], reference)


def math_verify_grade(completion, reference) -> bool:
    import math_verify

    target = str(int(reference)) if float(reference).is_integer() else repr(float(reference))
    return bool(math_verify.verify(math_verify.parse(target), math_verify.parse(completion)))


def test_grader_against_the_fields_graders():
    """On the battery, the disagreements of our grader and of math-verify with lm-eval's strict match and flexible
    extract and with each other, stated; the battery's verdict column decides each disagreement.

    Ours agrees with every verdict of the battery, so each of its disagreements with a field grader is that grader's
    error. Strict match disagrees with ours more often than with math-verify (30 vs 25) because it is a format check as
    much as a grader: it rejects right answers written any other way than `#### 18` (`#### **18**`, `#### +5`,
    `####1,234,567`, an answer in the text), and it grades `#### 3/4` as 3. Math-verify's 25 are 23 of those and 2 of
    its own errors. Counted on the items where strict (24) or flexible (45) agrees with the battery, ours disagrees
    with neither and math-verify with 2 and 7. No false positive for ours; math-verify grades `#### 3.5.2` as 3.5."""
    graders = {
        "ours": [V.compute_reward(c, reference) == 1.0 for c, reference, _, _ in BATTERY],
        "math-verify": [math_verify_grade(c, reference) for c, reference, _, _ in BATTERY],
        "strict": [lm_eval_strict(c, reference) for c, reference, _, _ in BATTERY],
        "flexible": [lm_eval_flexible(c, reference) for c, reference, _, _ in BATTERY],
    }
    battery = [reward == 1.0 for _, _, reward, _ in BATTERY]
    disagree = {
        who: {name: sum(a != b for a, b in zip(graders[who], grades)) for name, grades in graders.items() if name != who}
        | {"battery": sum(a != b for a, b in zip(graders[who], battery))}
        for who in graders
    }
    assert disagree == {
        "ours": {"math-verify": 9, "strict": 30, "flexible": 9, "battery": 0},
        "math-verify": {"ours": 9, "strict": 25, "flexible": 14, "battery": 9},
        "strict": {"ours": 30, "math-verify": 25, "flexible": 27, "battery": 30},
        "flexible": {"ours": 9, "math-verify": 14, "strict": 27, "battery": 9},
    }
    # Where the field's grader is right by the battery, who disagrees with it.
    for name, counts in (("strict", (24, 0, 2)), ("flexible", (45, 0, 7))):
        right = [n for n, (grade, verdict) in enumerate(zip(graders[name], battery)) if grade == verdict]
        wrong_where_right = [sum(graders[who][n] != graders[name][n] for n in right) for who in ("ours", "math-verify")]
        assert (len(right), *wrong_where_right) == counts, (name, len(right), wrong_where_right)
    false_positives = {
        name: [BATTERY[n][:2] for n, (grade, verdict) in enumerate(zip(grades, battery)) if grade and not verdict]
        for name, grades in graders.items()
    }
    assert false_positives == {
        "ours": [],
        "math-verify": [("#### 3.5.2", 3.5)],
        "strict": [("#### 3/4", 3)],
        "flexible": [("#### 3/4", 4), ("She ate 3/4 of it", 4)],
    }


def test_reference_answer():
    answer = "She sold 48/2 = <<48/2=24>>24 clips in May.\n48+24 = <<48+24=72>>72\n#### 1,072"
    assert V.reference_answer(answer) == 1072.0
    assert V.reference_answer("no final line") is None


# ---------------------------------------------------------------- GRPO advantages and losses


def test_grpo_advantages_against_hand_computation():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.5, 1.0, 0.5])
    advantages, zero_std = V.grpo_advantages(rewards, 4)
    s1 = math.sqrt(4 * 0.25 / 3)  # group 1: mean 0.5, Bessel-corrected std
    s3 = math.sqrt(0.5 / 3)  # group 3: mean 0.5, squared deviations 0.25 + 0 + 0.25 + 0
    expected = [0.5 / (s1 + 1e-4), -0.5 / (s1 + 1e-4), -0.5 / (s1 + 1e-4), 0.5 / (s1 + 1e-4)]
    expected += [0.0] * 4  # group 2: all equal, no signal
    expected += [-0.5 / (s3 + 1e-4), 0.0, 0.5 / (s3 + 1e-4), 0.0]
    assert advantages.tolist() == pytest.approx(expected, rel=1e-6)
    assert zero_std == pytest.approx(1 / 3)


def test_abs_deviation():
    log_ratio = torch.tensor([[0.0, 0.1, -0.2], [0.3, 5.0, 0.0]])
    mask = torch.tensor([[True, True, True], [True, False, False]])  # 5.0 is off the mask: not counted
    expected = sum(abs(math.exp(x) - 1) for x in [0.0, 0.1, -0.2, 0.3])
    assert V.abs_deviation(log_ratio, mask) == pytest.approx(expected, rel=1e-6)


def test_ppo_clip_is_asymmetric():
    # (ratio, advantage, per-token loss, clipped, d loss / d log pi) worked out by hand for clip 0.2 / 0.272
    cases = [
        (1.25, 1.0, -1.25, False, -1.25),  # inside 1.272: a symmetric 0.2 clip would have stopped it
        (1.30, 1.0, -1.272, True, 0.0),  # above 1 + 0.272: clipped, no gradient
        (0.85, -1.0, 0.85, False, 0.85),
        (0.75, -1.0, 0.8, True, 0.0),  # below 1 - 0.2: clipped
        (1.30, -1.0, 1.30, False, 1.30),  # pessimistic side keeps the unclipped term
        (0.75, 1.0, -0.75, False, -0.75),
    ]
    ratio = torch.tensor([c[0] for c in cases], dtype=torch.float64)
    advantages = torch.tensor([c[1] for c in cases], dtype=torch.float64)
    logp = ratio.log().requires_grad_()
    per_token, clipped = V.ppo_clip_loss(logp, torch.zeros_like(ratio), advantages, 0.2, 0.272)
    per_token.sum().backward()
    assert per_token.tolist() == pytest.approx([c[2] for c in cases])
    assert clipped.tolist() == [c[3] for c in cases]
    assert logp.grad.tolist() == pytest.approx([c[4] for c in cases])


@pytest.mark.parametrize("over_budget", [True, False])
def test_vaco_mask_zero_gradient_only_when_over_budget(over_budget):
    log_ratio = torch.tensor([0.1, 0.1, -0.1, -0.1, 0.0, 0.2], dtype=torch.float64)
    advantages = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0, 0.0], dtype=torch.float64)
    # Masked when over budget: the step would move the token's ratio further from 1 (A > 0 and r > 1, A < 0 and r < 1).
    expected_mask = [over_budget and a * math.copysign(1, x) > 0 and x != 0 for x, a in zip(log_ratio, advantages)]
    logp_behaviour = torch.full_like(log_ratio, -1.5)
    logp = (logp_behaviour + log_ratio).requires_grad_()
    per_token, masked = V.vaco_loss(logp, logp_behaviour, advantages, over_budget)
    per_token.sum().backward()
    assert masked.tolist() == expected_mask
    for i, (x, a) in enumerate(zip(log_ratio.tolist(), advantages.tolist())):
        if expected_mask[i]:
            assert logp.grad[i].item() == 0.0 and per_token[i].item() == 0.0
        else:
            assert logp.grad[i].item() == pytest.approx(-math.exp(x) * a)  # d(-r A)/d log pi = -r A
            assert per_token[i].item() == pytest.approx(-math.exp(x) * a)
    assert masked.sum().item() == (2 if over_budget else 0)


# ---------------------------------------------------------------- log-probs, padding and positions


def load_tiny(path):
    model, tokenizer = V.load_model_and_tokenizer(path)
    return model.eval(), tokenizer


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_completion_logprobs_match_unpadded_full_softmax(tiny, family):
    model, tokenizer = load_tiny(tiny[family])
    torch.manual_seed(0)
    sequences = [torch.randint(4, 100, (n,)).tolist() for n in (9, 5, 13)]
    num_completion, temperature = 4, 0.7
    ids, mask = V.left_pad(sequences, tokenizer.pad_token_id)
    with torch.no_grad():
        got = V.completion_logprobs(model, ids, mask, num_completion, temperature)
        for row, sequence in enumerate(sequences):  # independent: one unpadded sequence, full log-softmax
            logits = model(input_ids=torch.tensor([sequence])).logits[0] / temperature
            full = torch.log_softmax(logits.double(), dim=-1)[:-1]
            expected = full.gather(-1, torch.tensor(sequence[1:])[:, None]).squeeze(-1)[-num_completion:]
            assert torch.allclose(got[row].double(), expected, atol=1e-5)


def test_behaviour_logprobs_match_generation_time_logits(tiny):
    """Teacher-forced log-probs equal the ones the tokens were sampled from (left padding, position ids)."""
    model, tokenizer = load_tiny(tiny["qwen2"])
    stop_ids = V.stop_token_ids(model, tokenizer)
    model.generation_config = GenerationConfig(eos_token_id=stop_ids, pad_token_id=tokenizer.pad_token_id)
    config = GenerationConfig(do_sample=True, temperature=0.7, top_k=0, top_p=1.0, max_new_tokens=10)
    prompts = [V.encode_prompt(tokenizer, question) for question, _ in PROBLEMS[:3]]
    torch.manual_seed(1)
    batch = V.generate(model, prompts, config, stop_ids, tokenizer.pad_token_id, torch.device("cpu"))
    torch.manual_seed(1)
    ids, mask = V.left_pad(prompts, tokenizer.pad_token_id)
    output = model.generate(
        input_ids=ids, attention_mask=mask, generation_config=config, output_logits=True, return_dict_in_generate=True
    )
    completion_mask = batch["completion_mask"]
    assert len({len(p) for p in prompts}) > 1  # prompts of different lengths: real left padding
    sampled_tokens = output.sequences[:, ids.shape[1] :]
    sampled = torch.stack(output.logits, dim=1).double() / 0.7
    generation_logp = torch.log_softmax(sampled, -1).gather(-1, sampled_tokens[..., None]).squeeze(-1)
    behaviour = V.score(model, batch, 3, 0.7, lambda: torch.autocast("cpu", enabled=False))[completion_mask]
    assert torch.equal(sampled_tokens[completion_mask], batch["input_ids"][:, ids.shape[1] :][completion_mask])
    assert torch.allclose(behaviour.double(), generation_logp[completion_mask], atol=1e-4)


def test_output_head_stays_fp32_under_bf16_autocast(tiny):
    # The CUDA path (--bf16) exercised with CPU autocast: fp32 logits, autocast restored, also in a deep copy.
    model, _ = load_tiny(tiny["llama"])
    ids = torch.randint(4, 100, (2, 9))
    with torch.no_grad():
        fp32 = model(input_ids=ids).logits
        V.keep_output_head_fp32(model)
        copied = copy.deepcopy(model)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(input_ids=ids).logits
            assert torch.is_autocast_enabled("cpu")
            assert torch.equal(copied(input_ids=ids).logits, logits)
        assert not torch.is_autocast_enabled("cpu")
    assert logits.dtype == torch.float32
    assert not torch.equal(logits, fp32) and torch.allclose(logits, fp32, atol=0.05)  # the layers did run in bf16


def test_completion_mask_stops_after_first_stop_token(tiny):
    model, tokenizer = load_tiny(tiny["llama"])
    batch = {
        "input_ids": torch.tensor([[0, 5, 6, 7, 2, 8, 2], [5, 5, 6, 7, 8, 9, 10]]),
        "attention_mask": torch.tensor([[0, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 1]]),
        "completion_mask": torch.tensor([[True, True, False, False], [True, True, True, True]]),
    }
    slices = list(V.micro_batches(batch, 1))
    assert slices[0][1].tolist() == [[5, 6, 7, 2]]  # left pad and trailing padding trimmed
    assert slices[0][3].tolist() == [[True, True]]
    assert slices[1][1].shape == (1, 7)
    eos = tokenizer.eos_token_id
    model.generation_config = GenerationConfig(eos_token_id=[eos], pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    generated = V.generate(
        model, [[1, 5, 6]] * 16, GenerationConfig(do_sample=True, top_k=0, max_new_tokens=12), [eos], 0, "cpu"
    )
    completion = generated["input_ids"][:, 3:]
    for row, mask in zip(completion.tolist(), generated["completion_mask"].tolist()):
        n = sum(mask)
        assert mask == [True] * n + [False] * (len(mask) - n)
        assert eos not in row[: n - 1] and (n == len(row) or row[n - 1] == eos)


# ---------------------------------------------------------------- training loop


def test_first_step_ratio_is_exactly_one_with_no_lag(tiny, tmp_path, toy_reward):
    # Qwen2, micro-batches (trimmed separately) and gradient checkpointing: still r = 1 exactly at the first step.
    args = tiny_args(tiny, tmp_path, model_id=tiny["qwen2"], micro_batch_size=8, gradient_checkpointing=True)
    history = V.main(args)
    step = history["steps"][0]
    assert step["tv"] == 0.0 and step["approx_kl"] == 0.0 and step["filter_fraction"] == 0.0
    assert history["iterations"][0]["tv_final"] > 0.0  # the update did move the policy


@pytest.mark.parametrize("loss", ["ppo-clip", "vaco"])
def test_mean_reward_rises(tiny, tmp_path, toy_reward, loss):
    args = tiny_args(tiny, tmp_path, loss=loss, num_iterations=10, forward_lag=2, max_new_tokens=8, learning_rate=5e-3)
    history = V.main(args)
    rewards = [record["reward"] for record in history["iterations"]]
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.15, rewards
    first_steps = [s for s in history["steps"] if s["position"] == 1]
    assert all(s["tv"] == 0.0 for s in first_steps)  # no backward lag: the first minibatch is on-policy
    later = [s for s in history["steps"] if s["position"] == 2]
    dropped = "clip_fraction" if loss == "ppo-clip" else "filter_fraction"
    assert all(s[dropped] == 0.0 for s in first_steps)
    assert any(s[dropped] > 0.0 for s in later)
    if loss == "vaco":
        assert all(s["filter_fraction"] == 0.0 for s in history["steps"] if not s["over_budget"])
        assert all(s["over_budget"] == float(s["tv"] > V.Args.tv_threshold / 2) for s in history["steps"])


def test_vaco_filter_with_gradient_accumulation_matches_one_pass(tiny, tmp_path, toy_reward):
    """Splitting a minibatch into micro-batches changes neither D nor the mask nor the update."""
    runs = []
    for micro in (32, 8):
        runs.append(V.main(tiny_args(tiny, tmp_path, micro_batch_size=micro, forward_lag=2, learning_rate=1e-2)))
    one, accumulated = (run["steps"] for run in runs)
    assert any(s["over_budget"] for s in one)
    for a, b in zip(one, accumulated):
        assert a["over_budget"] == b["over_budget"] and a["filter_fraction"] == b["filter_fraction"]
        assert a["tv"] == pytest.approx(b["tv"], abs=1e-6)
        assert a["policy_loss"] == pytest.approx(b["policy_loss"], abs=1e-6)


def test_backward_lag_uses_stale_policies(tiny, tmp_path, toy_reward):
    args = tiny_args(tiny, tmp_path, lag=2, lag_mode="fixed", num_iterations=4, learning_rate=1e-2, loss="ppo-clip")
    history = V.main(args)
    records = history["iterations"]
    assert [r["staleness"] for r in records] == [0, 1, 2, 2]
    assert records[0]["tv_backward"] == 0.0  # the buffer holds only the current policy
    assert all(r["tv_backward"] > 0.0 for r in records[1:])


def test_same_seed_same_result(tiny, tmp_path, toy_reward):
    keys = ["reward", "tv_final", "response_length", "zero_std_fraction"]
    runs = [V.main(tiny_args(tiny, tmp_path, num_iterations=2, lag=1)) for _ in range(2)]
    assert [[r[k] for k in keys] for r in runs[0]["iterations"]] == [[r[k] for k in keys] for r in runs[1]["iterations"]]
    assert runs[0]["steps"] == runs[1]["steps"]


def test_nan_loss_stops_with_a_message(tiny, tmp_path, monkeypatch):
    monkeypatch.setattr(V, "compute_reward", lambda completion, reference: float("nan"))
    with pytest.raises(SystemExit) as stop:
        V.main(tiny_args(tiny, tmp_path))
    assert "non-finite loss" in str(stop.value.code)


# ---------------------------------------------------------------- inputs and command line


def expect_usage_error(capsys, call, *fragments):
    with pytest.raises(SystemExit) as stop:
        call()
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    for fragment in fragments:
        assert fragment in err, err


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--micro-batch-size", "48"], "--micro-batch-size (48) must divide"),
        (["--num-generations", "1"], "--num-generations"),
        (["--forward-lag", "0"], "--forward-lag"),
        (["--lag", "-1"], "--lag"),
        (["--clip-low", "1.5"], "--clip-low"),
        (["--tv-threshold", "0"], "--tv-threshold"),
        (["--data-file", "/no/such/train.jsonl"], "does not exist"),
        (["--eval-data-file", "/no/such/test.jsonl"], "does not exist"),
        (["--model-id", "/no/such/model"], "no such model folder"),
        (["--model-id", "./not/here"], "no such model folder"),
        (["--seed", "abc"], "--seed"),  # tyro's own errors are folded into one line too
        (["--no-such-flag", "1"], "Unrecognized options"),
        (["--loss", "sgd"], "--loss"),
        # Numbers far out of range stop here, before anything is made (not as overflows later on).
        (["--seed", str(2**64)], "--seed must be in [0, 2**32)"),
        (["--lag", str(10**20)], "--lag must be in [0, 2**31)"),
        (["--forward-lag", str(10**20)], "--forward-lag must be in [1, 2**31)"),
        (["--total-steps", str(2**40)], "--total-steps must be in [1, 2**31)"),
        (["--num-iterations", str(10**20)], "--num-iterations must be in [1, 2**31)"),
        (["--max-new-tokens", str(10**20)], "--max-new-tokens must be in [1, 131072]"),
        (["--torch-threads", str(10**20)], "--torch-threads must be in [1, 4096]"),
        (["--prompts-per-step", str(2**30), "--micro-batch-size", "8"], "must be <= 1048576 sequences"),
        # Real numbers that would be taken without meaning: huge, 2**64, subnormal, zero, NaN, infinite.
        (["--temperature", "1e20"], "--temperature must be in [0.01, 10]"),
        (["--temperature", "1e-320"], "--temperature must be in [0.01, 10]"),
        (["--learning-rate", str(2**64)], "--learning-rate must be in [1e-10, 1]"),
        (["--learning-rate", "1e-320"], "--learning-rate must be in [1e-10, 1]"),
        (["--learning-rate", "nan"], "--learning-rate must be in [1e-10, 1]"),
        (["--clip-high", "1e20"], "--clip-high must be in [1e-4, 100]"),
        (["--clip-high", "1e-320"], "--clip-high must be in [1e-4, 100]"),
        (["--clip-low", "1e-320"], "--clip-low must be in [1e-4, 1)"),
        (["--tv-threshold", str(2**64)], "--tv-threshold must be in [1e-6, 2]"),
        (["--tv-threshold", "1e-320"], "--tv-threshold must be in [1e-6, 2]"),
        (["--max-grad-norm", "inf"], "--max-grad-norm must be in [1e-6, 1e6]"),
        # --exp-name names the default run folder.
        (["--exp-name", ""], "--exp-name must be 1 to 100 characters"),
        (["--exp-name", "a/b"], "--exp-name must be 1 to 100 characters"),
        (["--exp-name", ".."], "--exp-name must be 1 to 100 characters"),
        (["--exp-name", "x" * 101], "--exp-name must be 1 to 100 characters"),
        # Data files must be regular files; a model path that does not exist is not a hub id.
        (["--data-file", "/dev/null"], "--data-file /dev/null is not a regular file"),
        (["--model-id", "tests/no_such_model"], "no such model folder"),  # tests/ exists here: a path
        (["--model-id", "my model"], "no such model folder"),  # not a hub id
    ],
)
def test_bad_arguments_exit_2_with_one_line(capsys, monkeypatch, argv, fragment):
    monkeypatch.chdir(ROOT)
    expect_usage_error(capsys, lambda: V.parse_args(argv), fragment)


def test_seed_plus_rank_must_stay_in_numpy_range(capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    expect_usage_error(capsys, lambda: V.parse_args(["--seed", str(2**32 - 1)]), "--seed + processes - 1 must be < 2**32")


def test_sweep_style_booleans(tiny):
    args = V.parse_args(["--track=True", "--save_model=True", "--cuda=False", "--model_id", tiny["llama"], "--lag=2"])
    assert args.track and args.save_model and not args.cuda and args.lag == 2
    assert not V.parse_args(["--track=False", "--model-id", tiny["llama"]]).track


def test_malformed_jsonl_names_the_line(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    lines = [json.dumps({"question": "q", "answer": "#### 1"}), "", "{not json", json.dumps({"question": "q"})]
    bad.write_text("\n".join(lines) + "\n")
    expect_usage_error(capsys, lambda: V.load_jsonl(str(bad)), f"{bad}:3:", "malformed JSON")
    bad.write_text("\n".join(lines[:2] + lines[3:]) + "\n")
    expect_usage_error(capsys, lambda: V.load_jsonl(str(bad)), f"{bad}:3:", "'question' and 'answer'")
    bad.write_text(json.dumps({"question": "q", "answer": "no final answer"}) + "\n")
    expect_usage_error(capsys, lambda: V.load_jsonl(str(bad)), f"{bad}:1:", "####")


def test_bad_data_stops_before_the_model_loads(tmp_path, capsys, monkeypatch):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("[1, 2]\n")
    monkeypatch.setattr(V, "load_model_and_tokenizer", lambda model_id: pytest.fail("model loaded"))
    args = V.Args(data_file=str(bad), run_dir=str(tmp_path / "run"), eval_every=0)
    expect_usage_error(capsys, lambda: V.main(args), f"{bad}:1:")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("offline_flag", [True, False])
def test_hub_model_without_network_asks_for_a_local_folder(capsys, monkeypatch, offline_flag):
    # Without HF_HUB_OFFLINE, a failed DNS lookup stands for "no network": no download is attempted.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", offline_flag)
    monkeypatch.setattr(V, "hub_resolvable", lambda: False)
    expect_usage_error(
        capsys, lambda: V.load_model_and_tokenizer("vaco-tests/no-such-model"), "vaco-tests/no-such-model", "--model-id"
    )


def test_hub_dataset(monkeypatch, capsys):
    import datasets

    rows = [{"question": q, "answer": a} for q, a in PROBLEMS[:2]]
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # datasets then reads its cache only
    monkeypatch.setattr(datasets, "load_dataset", lambda name, config, split: rows)
    assert V.load_split(None, "train") == [(PROBLEMS[0][0], 7.0), (PROBLEMS[1][0], 36.0)]

    def offline(name, config, split):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    expect_usage_error(capsys, lambda: V.load_split(None, "train"), "openai/gsm8k", "--data-file")
    expect_usage_error(capsys, lambda: V.load_split(None, "test"), "--eval-data-file")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(V, "hub_resolvable", lambda: False)  # no network: fail at once, do not retry
    expect_usage_error(capsys, lambda: V.load_split(None, "train"), "no network", "--data-file")


def test_command_line_run_logs_evaluates_and_saves(tiny, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    env = dict(os.environ, WANDB_MODE="offline", WANDB_DIR=str(tmp_path), HF_HUB_OFFLINE="1")
    command = [sys.executable, str(ROOT / "vaco_gsm8k.py"), "--model_id", tiny["llama"], "--data-file", tiny["data"]]
    command += ["--eval-data-file", tiny["data"], "--eval-every=1", "--eval-size=5", "--num-iterations=2"]
    command += ["--forward-lag=2", "--prompts-per-step=2", "--num-generations=4", "--micro-batch-size=4"]
    command += ["--max-new-tokens=8", "--torch_threads=1", "--track=True", "--save-model", "--loss", "vaco"]
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("iter ") == 2 and result.stdout.count("eval step") == 3
    order = [line.split(":")[0][:10] for line in result.stdout.splitlines() if line.startswith(("iter ", "eval "))]
    assert order == ["eval step ", "iter 1/2 s", "eval step ", "iter 2/2 s", "eval step "], order  # each after its iteration
    assert "it/s" not in result.stderr + result.stdout and "Warning" not in result.stderr  # quiet: no progress bars

    (run_dir,) = glob.glob(str(tmp_path / "runs" / "gsm8k__vaco_gsm8k__vaco__1__*"))
    saved = json.loads(Path(run_dir, "args.json").read_text())
    assert saved["forward_lag"] == 2 and saved["track"] is True
    events = EventAccumulator(run_dir)
    events.Reload()
    tags = set(events.Tags()["scalars"])
    ppo_only = {"losses/clipfrac", "losses/clip_ratio_low", "losses/clip_ratio_high"}
    expected = set(V.STEP_TAGS.values()) - ppo_only - {"losses/reference_kl"} | set(V.ITERATION_TAGS.values())  # --beta
    expected |= {"eval/accuracy", "eval/format_rate", "perf/generation_seconds", "perf/other_seconds"}
    assert expected <= tags, expected - tags
    assert not ppo_only & tags  # PPO-clip statistics
    assert f"run folder: {os.path.relpath(run_dir, tmp_path)}" in result.stdout and "memory estimate" in result.stdout
    assert "device: cpu (--cuda: torch sees no CUDA device)\n" in result.stdout  # --cuda is the default
    assert json.loads(Path(run_dir, "summary.json").read_text())["interrupted"] is False
    assert len(events.Scalars("vaco/tv")) == 4 and len(events.Scalars("eval/accuracy")) == 3
    model, tokenizer = V.load_model_and_tokenizer(os.path.join(run_dir, "model"))
    assert tokenizer.chat_template == V.AutoTokenizer.from_pretrained(tiny["llama"]).chat_template
    assert glob.glob(str(tmp_path / "wandb" / "offline-run-*"))


# ---------------------------------------------------------------- validation table, run folders, signals, resume


def bad_input_cases(tmp_path, tiny):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    existing = tmp_path / "existing"  # a run of this script whose args.json is another run's
    existing.mkdir()
    (existing / "run.json").write_text(json.dumps({"script": "vaco_gsm8k", "format": 1, "run_id": "0" * 32}))
    other_run = {**dataclasses.asdict(V.Args(model_id=tiny["llama"])), "exp_name": "other"}
    (existing / "args.json").write_text(json.dumps(other_run))
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "run.json").write_text(json.dumps({"script": "vaco_gsm8k", "format": 1, "run_id": "0" * 32}))
    (garbage / "args.json").write_text("not json")
    return [
        (["--seed", "-1"], "--seed must be in [0, 2**32)"),
        (["--learning-rate", "nan"], "--learning-rate must be in [1e-10, 1]"),
        (["--max-grad-norm", "inf"], "--max-grad-norm must be in [1e-6, 1e6]"),
        (["--final-tv-fraction", "1.5"], "--final-tv-fraction must be in [0, 1]"),
        (
            ["--total-steps", "5", "--forward-lag", "2"],
            "--total-steps (5) must be a multiple of --forward-lag x --num-epochs (2)",
        ),
        (["--data-file", str(tmp_path)], "is a directory"),
        (["--run-dir", str(a_file / "sub")], "is under a file"),
        (["--run-dir", str(a_file)], "is a file"),
        (["--run-dir", str(existing)], "already holds a run: --resume continues it, --overwrite replaces it"),
        (["--run-dir", str(existing), "--resume"], "--resume: --exp-name is vaco_gsm8k here but other in"),
        (["--run-dir", str(garbage), "--resume"], "args.json is not JSON (Expecting value"),
        (["--resume"], "--resume needs the --run-dir"),
        (["--run-dir", str(existing), "--resume", "--overwrite"], "exclude each other"),
        (["--run-dir", str(tmp_path / "new"), "--resume"], "holds no run"),
    ]


def test_bad_inputs_one_line_and_nothing_left_behind(tiny, tmp_path, capsys):
    for argv, fragment in bad_input_cases(tmp_path, tiny):
        before = sorted(os.listdir(tmp_path))
        expect_usage_error(capsys, lambda: V.parse_args(["--model-id", tiny["llama"], *argv]), fragment)
        assert sorted(os.listdir(tmp_path)) == before, argv
    # Where the permission bits say yes (as root) but the file system says no, the claim refuses it.
    expect_usage_error(capsys, lambda: V.main(tiny_args(tiny, tmp_path, run_dir="/proc/x")), "/proc/x")


def test_non_utf8_data_stops_before_the_run_folder(tiny, tmp_path, capsys):
    bad = tmp_path / "latin1.jsonl"
    bad.write_bytes(json.dumps({"question": "caf\u00e9", "answer": "#### 1"}, ensure_ascii=False).encode("latin-1") + b"\n")
    args = tiny_args(tiny, tmp_path, data_file=str(bad))
    expect_usage_error(capsys, lambda: V.main(args), f"{bad}:1: not UTF-8 text")
    assert not Path(args.run_dir).exists()


def test_existing_run_is_refused_then_overwritten(tiny, tmp_path, capsys):
    """A run is refused without a flag; --overwrite replaces it, but never deletes a file the run did not write."""
    args = tiny_args(tiny, tmp_path, overwrite=False, checkpoint_every=0)
    V.main(args)
    run_id = json.loads(Path(args.run_dir, "run.json").read_text())["run_id"]
    notes = Path(args.run_dir, "notes.txt")
    notes.write_text("the user's")
    expect_usage_error(capsys, lambda: V.main(args), "already holds a run: --resume continues it")
    overwrite = dataclasses.replace(args, overwrite=True)
    expect_usage_error(capsys, lambda: V.main(overwrite), "--overwrite:", "not part of a run: notes.txt")
    assert notes.read_text() == "the user's" and Path(args.run_dir, "summary.json").exists()
    notes.unlink()
    V.main(overwrite)
    assert json.loads(Path(args.run_dir, "run.json").read_text())["run_id"] != run_id  # a new run
    changed = dataclasses.replace(args, resume=True, lag=1)
    expect_usage_error(capsys, lambda: V.main(changed), "--resume: --lag is 1 here but 0 in")


def test_resume_whatever_the_folder_is_called(tiny, tmp_path, monkeypatch):
    """A run resumes from its folder however it is spelled (trailing slash, relative, default runs/ folder) and
    after the folder was copied elsewhere: the saved args.json does not pin --run-dir."""
    monkeypatch.chdir(tmp_path)
    first = tiny_args(tiny, tmp_path, run_dir=None, overwrite=False, checkpoint_every=1)
    V.main(first)
    (folder,) = Path("runs").iterdir()  # the default folder, runs/gsm8k__...
    assert json.loads((folder / "args.json").read_text())["run_dir"] is None
    resume = dict(resume=True, overwrite=False, checkpoint_every=1)
    for iterations, spelling in enumerate([str(folder), str(folder) + "/", str(tmp_path / folder)], start=2):
        history = V.main(dataclasses.replace(first, run_dir=spelling, num_iterations=iterations, **resume))
        assert len(history["iterations"]) == iterations, spelling
    shutil.copytree(folder, tmp_path / "moved")
    history = V.main(dataclasses.replace(first, run_dir="moved", num_iterations=5, **resume))
    assert len(history["iterations"]) == 5
    assert V.load_checkpoint(str(tmp_path / "moved" / V.CHECKPOINT))["iteration"] == 5


def test_checkpoint_write_keeps_the_previous_one(tmp_path, monkeypatch):
    path = str(tmp_path / V.CHECKPOINT)
    V.write_checkpoint_file(path, {"iteration": 1, "run_id": "r"})
    assert not (tmp_path / V.PREVIOUS_CHECKPOINT).exists()
    V.write_checkpoint_file(path, {"iteration": 2, "run_id": "r"})
    V.write_checkpoint_file(path, {"iteration": 3, "run_id": "r"})
    assert V.checkpoint_problem(path, "r") is None and V.checkpoint_problem(path, "another") is not None

    def crash(state, target):  # dies half-way through writing the new checkpoint
        target.write(b"PK\x03\x04 half a checkpoint")
        raise KeyboardInterrupt

    monkeypatch.setattr(V.torch, "save", crash)
    with pytest.raises(KeyboardInterrupt):
        V.write_checkpoint_file(path, {"iteration": 4, "run_id": "r"})
    assert V.load_checkpoint(path) == {"iteration": 3, "run_id": "r"}
    assert V.load_checkpoint(str(tmp_path / V.PREVIOUS_CHECKPOINT)) == {"iteration": 2, "run_id": "r"}
    assert sorted(os.listdir(tmp_path)) == sorted([V.CHECKPOINT, V.PREVIOUS_CHECKPOINT])  # no .tmp left


def damage(path: Path, how: str):
    data = path.read_bytes()
    if how == "empty":
        path.write_bytes(b"")
    elif how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "garbage":
        path.write_bytes(bytes(range(256)) * 40)
    elif how == "flipped":  # one byte of the payload's middle changed: only the digest sees it
        middle = V.CHECKPOINT_HEADER_BYTES + (len(data) - V.CHECKPOINT_HEADER_BYTES) // 2
        path.write_bytes(data[:middle] + bytes([data[middle] ^ 0x01]) + data[middle + 1 :])
    else:  # a whole torch.save file of this run's state, without the header
        torch.save(V.load_checkpoint(str(path)), path)


@pytest.mark.parametrize("how", ["empty", "truncated", "garbage", "flipped", "headerless"])
def test_damaged_checkpoint_one_line_and_the_previous_one_named(tiny, tmp_path, capsys, how):
    args = tiny_args(tiny, tmp_path, num_iterations=2, checkpoint_every=1)
    V.main(args)
    run_dir = Path(args.run_dir)
    assert V.load_checkpoint(str(run_dir / V.PREVIOUS_CHECKPOINT))["iteration"] == 1
    damage(run_dir / V.CHECKPOINT, how)
    before = {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir()}
    resume = dataclasses.replace(args, num_iterations=3, resume=True, overwrite=False)
    argv = ["--model-id", tiny["llama"], "--data-file", tiny["data"], "--run-dir", args.run_dir, "--resume"]
    argv += ["--eval-every", "0", "--prompts-per-step", "4", "--micro-batch-size", "32", "--max-new-tokens", "12"]
    argv += ["--learning-rate", "3e-3"]
    reason = "digest mismatch" if how in ("truncated", "flipped") else "no checkpoint header"  # a cut payload too
    remedy = f"the one before is whole: mv {run_dir / V.PREVIOUS_CHECKPOINT} {run_dir / V.CHECKPOINT}"
    expect_usage_error(capsys, lambda: V.parse_args(argv), f"checkpoint.pt is damaged ({reason})", remedy)
    expect_usage_error(capsys, lambda: V.main(resume), f"checkpoint.pt is damaged ({reason})", remedy)
    assert {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir()} == before
    shutil.copyfile(run_dir / V.PREVIOUS_CHECKPOINT, run_dir / V.CHECKPOINT)  # the remedy the message gives
    assert len(V.main(resume)["iterations"]) == 3


def test_run_without_checkpoint_restarts_with_resume(tiny, tmp_path, capsys, toy_reward):
    """A run that stopped before its first checkpoint (args.json, logs, no checkpoint.pt) starts again with
    --resume, as if new, without --overwrite."""
    args = tiny_args(tiny, tmp_path, overwrite=False, num_iterations=2)
    fresh = V.main(dataclasses.replace(args, run_dir=str(tmp_path / "fresh")))
    V.main(args)
    os.remove(Path(args.run_dir) / V.CHECKPOINT)
    expect_usage_error(capsys, lambda: V.main(args), "already holds a run: --resume continues it")
    restarted = V.main(dataclasses.replace(args, resume=True))
    out = capsys.readouterr().out
    assert "starting the run again from the beginning" in out
    clock = r"\d+:\d\d:\d\d"
    ends = re.findall(rf"(?m)^iter (\d)/2 .* \| elapsed {clock} \| ETA ({clock})$", out)  # the time left, in the line
    assert [i for i, _ in ends] == ["1", "2"] and ends[-1][1] == "0:00:00", out
    assert without_timings(restarted) == without_timings(fresh)
    assert (Path(args.run_dir) / V.CHECKPOINT).exists()


def without_timings(history):
    return {
        part: [{k: v for k, v in r.items() if not k.endswith(("_seconds", "_per_s"))} for r in records]
        for part, records in history.items()
    }


def test_resumed_run_equals_uninterrupted(tiny, tmp_path, toy_reward):
    settings = dict(loss="vaco", lag=1, forward_lag=2, micro_batch_size=8, learning_rate=1e-2, checkpoint_every=1)
    whole = V.main(tiny_args(tiny, tmp_path, run_dir=str(tmp_path / "whole"), num_iterations=3, **settings))
    V.main(tiny_args(tiny, tmp_path, run_dir=str(tmp_path / "part"), num_iterations=2, **settings))
    part = tiny_args(tiny, tmp_path, run_dir=str(tmp_path / "part"), num_iterations=3, overwrite=False, resume=True)
    resumed = V.main(dataclasses.replace(part, **settings))
    assert without_timings(resumed) == without_timings(whole)
    assert any(s["over_budget"] for s in whole["steps"])  # the filter acted: a real test of the mask state
    saved = [V.load_checkpoint(str(tmp_path / name / V.CHECKPOINT)) for name in ("whole", "part")]
    # The checkpoint format (RUN_FORMAT 1): a resume reads these keys.
    fields = "model optimizer policy_buffer data_rng order rng history counters iteration world_size run_name wandb_id"
    fields += " run_id"
    assert set(saved[0]) == set(fields.split()) and saved[0]["counters"].keys() == {"global_step", "tokens_seen"}
    for key, value in saved[0]["model"].items():
        assert torch.equal(value, saved[1]["model"][key]), key
    buffers = [s["policy_buffer"] for s in saved]
    assert all(torch.equal(a[k], b[k]) for a, b in zip(*buffers) for k in a)
    adam = [s["optimizer"]["state"] for s in saved]
    assert all(torch.equal(adam[0][i]["exp_avg_sq"], adam[1][i]["exp_avg_sq"]) for i in adam[0])


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_saves_the_model_and_marks_the_summary(tiny, tmp_path, signum, code):
    run_dir = tmp_path / "run"
    command = [sys.executable, str(ROOT / "vaco_gsm8k.py"), "--model-id", tiny["llama"], "--data-file", tiny["data"]]
    command += ["--eval-every=0", "--num-iterations=1000", "--prompts-per-step=2", "--num-generations=4"]
    command += ["--micro-batch-size=8", "--max-new-tokens=8", "--torch-threads=1", "--save-model=True"]
    command += ["--run-dir", str(run_dir)]
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in process.stdout:  # stop it in the middle of training
        if line.startswith("iter 2/"):
            process.send_signal(signum)
            break
    out, err = process.communicate(timeout=120)
    assert process.returncode == code, err[-2000:]
    assert f"{signal.Signals(signum).name}: stopping after this iteration" in out
    assert V.load_checkpoint(str(run_dir / "checkpoint.pt"))["iteration"] >= 2  # the iteration it ended
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["interrupted"] == signal.Signals(signum).name and summary["global_step"] >= 2
    model, _ = V.load_model_and_tokenizer(str(run_dir / "model"))
    assert sum(p.numel() for p in model.parameters()) > 0


# ---------------------------------------------------------------- metrics, budget, truncation, timers


def test_entropy_against_full_softmax(tiny):
    model, tokenizer = load_tiny(tiny["llama"])
    ids, mask = V.left_pad([[5, 6, 7, 8, 9, 10], [11, 12, 13]], tokenizer.pad_token_id)
    with torch.no_grad():
        _, entropy = V.completion_logprobs(model, ids, mask, 2, 0.7, with_entropy=True)
        logits = model(input_ids=torch.tensor([[5, 6, 7, 8, 9, 10]])).logits[0, -3:-1].double() / 0.7
    p = torch.softmax(logits, -1)
    assert torch.allclose(entropy[0].double(), -(p * p.log()).sum(-1), atol=1e-5)


def test_metrics_against_the_rewards_they_summarise(tiny, tmp_path, monkeypatch):
    seen = []

    def recording_reward(completion, reference):
        seen.append((len(completion) % 3) / 2)
        return seen[-1]

    monkeypatch.setattr(V, "compute_reward", recording_reward)
    history = V.main(tiny_args(tiny, tmp_path, loss="ppo-clip", forward_lag=2, learning_rate=3e-2))
    record = history["iterations"][0]
    rewards = torch.tensor(seen).view(-1, 8)
    assert record["reward"] == pytest.approx(rewards.mean().item())
    assert record["reward_std"] == pytest.approx(rewards.std(dim=1).mean().item())  # TRL: mean of the group stds
    assert record["response_length_min"] <= record["response_length"] <= record["response_length_max"] <= 12
    for step in history["steps"]:
        assert step["clip_fraction"] == pytest.approx(step["clip_ratio_low"] + step["clip_ratio_high"])
        assert step["learning_rate"] == 3e-2 and step["entropy"] > 0
    assert any(s["clip_ratio_low"] > 0 or s["clip_ratio_high"] > 0 for s in history["steps"])
    assert record["tokens_seen"] > 2 * 32 * record["response_length"]  # prompts and completions


def test_total_steps_fixes_optimizer_steps_across_forward_lags(tiny, tmp_path, toy_reward):
    for k in (1, 2, 4):
        history = V.main(tiny_args(tiny, tmp_path, forward_lag=k, total_steps=4, num_iterations=99, max_new_tokens=4))
        assert len(history["steps"]) == 4 and len(history["iterations"]) == 4 // k


def test_masked_completions_against_a_loop():
    generator = torch.Generator().manual_seed(0)
    mask = torch.rand(6, 5, generator=generator) > 0.4
    mask[2] = False  # a row with no token in the loss
    dropped = torch.rand(6, 5, generator=generator) > 0.7
    dropped[2, 0] = True  # off the mask
    masked, with_tokens = 0, 0
    for mask_row, dropped_row in zip(mask.tolist(), dropped.tolist()):
        taken = [d for m, d in zip(mask_row, dropped_row) if m]  # a flag off the mask does not count
        masked += any(taken)
        with_tokens += bool(taken)
    assert V.masked_completions(mask, dropped) == (masked, with_tokens)
    assert 0 < masked < with_tokens < 6
    assert bool((dropped & ~mask).any())


def test_filter_completion_fraction_is_logged_and_zero_when_nothing_is_masked(tiny, tmp_path, toy_reward):
    settings = dict(loss="vaco", forward_lag=2, learning_rate=5e-2, tv_threshold=1e-4, num_iterations=2)
    steps = V.main(tiny_args(tiny, tmp_path, **settings))["steps"]
    for step in steps:
        assert (step["filter_completion_fraction"] > 0) == (step["filter_fraction"] > 0)
        assert step["filter_fraction"] <= step["filter_completion_fraction"] <= 1
    assert any(s["filter_fraction"] > 0 for s in steps)


def test_at_k1_ppo_clip_and_vaco_are_the_same_run(tiny, tmp_path, toy_reward):
    """r = 1 exactly at K = 1 (no lag): nothing is clipped or filtered and the updates coincide, which is why
    tools/studies/gsm8k_forward_lag.py makes that run once for both losses."""
    runs = {
        loss: V.main(tiny_args(tiny, tmp_path, run_dir=str(tmp_path / loss), loss=loss, num_iterations=3))
        for loss in ("ppo-clip", "vaco")
    }
    shared = ["reward", "accuracy", "tv_final", "response_length"]
    assert [[r[k] for k in shared] for r in runs["vaco"]["iterations"]] == [
        [r[k] for k in shared] for r in runs["ppo-clip"]["iterations"]
    ]
    assert [s["policy_loss"] for s in runs["vaco"]["steps"]] == [s["policy_loss"] for s in runs["ppo-clip"]["steps"]]
    assert runs["vaco"]["iterations"][-1]["tv_final"] > 0  # the policy moved: a real comparison


def test_masked_truncated_completions_carry_no_gradient(tiny, tmp_path, toy_reward, monkeypatch):
    monkeypatch.setattr(V, "stop_token_ids", lambda model, tokenizer: [10**6])  # no stop token: all truncated
    runs = {m: V.main(tiny_args(tiny, tmp_path, max_new_tokens=3, mask_truncated_completions=m)) for m in (False, True)}
    assert runs[True]["iterations"][0]["truncated_fraction"] == 1.0
    assert runs[True]["steps"][0]["grad_norm"] == 0.0 and runs[True]["steps"][0]["policy_loss"] == 0.0
    assert runs[False]["steps"][0]["grad_norm"] > 0.0


def test_phase_timers_add_up_to_wall_time(tiny, tmp_path, toy_reward):
    start = time.perf_counter()
    history = V.main(tiny_args(tiny, tmp_path, num_iterations=2, forward_lag=2, lag=1, micro_batch_size=8))
    wall = time.perf_counter() - start
    for record in history["iterations"]:
        phases = sum(
            v for k, v in record.items() if k.endswith("_seconds") and k not in ("iteration_seconds", "other_seconds")
        )
        assert phases + record["other_seconds"] == pytest.approx(record["iteration_seconds"])
        assert record["other_seconds"] < 0.2 * record["iteration_seconds"], record
        assert {"generation_seconds", "behaviour_seconds", "prescore_seconds", "final_tv_seconds"} <= set(record)
    assert sum(r["iteration_seconds"] for r in history["iterations"]) < wall


def test_skipped_behaviour_pass_equals_the_training_pass(tiny):
    """With no backward lag the first minibatch's training forward pass replaces the behaviour pass: it scores
    the same micro-batches with the same weights, and gives bit-identical log-probs (train mode, autograd on,
    gradient checkpointing included)."""
    model, tokenizer = load_tiny(tiny["qwen2"])
    stop_ids = V.stop_token_ids(model, tokenizer)
    model.generation_config = GenerationConfig(eos_token_id=stop_ids, pad_token_id=tokenizer.pad_token_id)
    config = GenerationConfig(do_sample=True, top_k=0, top_p=1.0, max_new_tokens=10)
    prompts = [V.encode_prompt(tokenizer, q) for q, _ in PROBLEMS for _ in range(2)]
    torch.manual_seed(3)
    batch = V.generate(model, prompts, config, stop_ids, tokenizer.pad_token_id, "cpu", chunk=5)
    behaviour = V.score(model, batch, 4, 1.0, lambda: torch.autocast("cpu", enabled=False))
    model.train()
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    for rows, ids, mask, completion_mask in V.micro_batches(batch, 4):
        logp = V.completion_logprobs(model, ids, mask, completion_mask.shape[1], 1.0)
        assert logp.requires_grad
        assert torch.equal(logp.detach()[completion_mask], behaviour[rows, : completion_mask.shape[1]][completion_mask])


# ---------------------------------------------------------------- data-parallel training (torch.distributed, gloo)


def seeded_generate(model, prompts, config, stop_ids, pad_id, device, chunk=0):
    """A stand-in for sampling whose completion of a prompt depends only on the prompt and its index in the
    group, not on which process generates it or next to which other prompts: so 1 and 2 processes train
    on the same completions and their updates can be compared."""
    completions = torch.full((len(prompts), config.max_new_tokens), pad_id, dtype=torch.long)
    for i, prompt in enumerate(prompts):
        rng = torch.Generator().manual_seed(sum(t * 31**n for n, t in enumerate(prompt)) % 2**31 + 7919 * (i % 8))
        length = int(torch.randint(1, config.max_new_tokens + 1, (1,), generator=rng))
        completions[i, :length] = torch.randint(4, 100, (length,), generator=rng)
        if length < config.max_new_tokens:
            completions[i, length] = stop_ids[0]
    prompt_ids, prompt_mask = V.left_pad(prompts, pad_id)
    return V.completion_batch(prompt_ids, prompt_mask, completions, stop_ids, pad_id)


def distributed_worker(rank, world, port, settings):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world), RANK=str(rank))
    os.environ["LOCAL_RANK"] = str(rank)
    torch.set_num_threads(1)
    V.generate, V.compute_reward = seeded_generate, digit_fraction
    history = V.main(V.Args(**settings))
    if rank == 0:
        Path(settings["run_dir"], "history.json").write_text(json.dumps(history))


@pytest.mark.parametrize(
    "loss, micro, lag",
    [
        ("vaco", 16, 0),
        ("vaco", 8, 0),  # gradient accumulation: 2 micro-batches per rank, 4 in the single process
        ("ppo-clip", 16, 1),
    ],
)
def test_two_processes_equal_one(tiny, tmp_path, monkeypatch, loss, micro, lag):
    """2 processes (gloo) and 1 process on the same prompts and completions: the same parameters after
    2 optimizer steps (one generation batch at K = 2), the same D, mask and logged statistics. With backward
    lag (3 generation batches, a uniform draw from the policy buffer), every rank draws the same policy."""
    import socket as socket_module

    import torch.multiprocessing as mp

    settings = dict(
        dataclasses.asdict(tiny_args(tiny, tmp_path, loss=loss, forward_lag=2, micro_batch_size=micro, lag=lag)),
        num_iterations=3 if lag else 1,
        learning_rate=1e-2,
        save_model=True,
        checkpoint_every=0,
    )
    with socket_module.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    two = dict(settings, run_dir=str(tmp_path / "two"))
    mp.spawn(distributed_worker, args=(2, port, two), nprocs=2, join=True)
    monkeypatch.setattr(V, "generate", seeded_generate)
    monkeypatch.setattr(V, "compute_reward", digit_fraction)
    one = dict(settings, run_dir=str(tmp_path / "one"))
    single = V.main(V.Args(**one))
    double = json.loads(Path(two["run_dir"], "history.json").read_text())
    for a, b in zip(single["steps"], double["steps"]):
        for key, value in a.items():
            assert value == pytest.approx(b[key], rel=1e-5, abs=1e-7), key
    if loss == "vaco":
        assert any(s["over_budget"] for s in single["steps"]) and any(s["filter_fraction"] > 0 for s in single["steps"])
    for key in ["reward", "reward_std", "response_length", "response_length_min", "response_length_max", "tv_final"]:
        for a, b in zip(single["iterations"], double["iterations"]):
            assert a[key] == pytest.approx(b[key], rel=1e-5), key
    assert [r["staleness"] for r in single["iterations"]] == [r["staleness"] for r in double["iterations"]]
    models = [V.load_model_and_tokenizer(str(tmp_path / name / "model"))[0] for name in ("one", "two")]
    start = V.load_model_and_tokenizer(tiny["llama"])[0].state_dict()
    # The tolerance scales with how far the update moved the tensor. Adam's first steps move every weight by
    # about lr whatever the size of its gradient, so a weight whose gradient is near zero moves by an amount
    # set by summation-order noise: with accumulation, the single process at --micro-batch-size 8 and at 32
    # (no second process at all) differ by up to 8e-4 of the movement, and 2 processes vs 1 by 1.6e-4 (measured at lr 1e-2).
    # A missing or wrong gradient reduction moves weights by ~lr in another direction, far outside it.
    for key, value in models[0].state_dict().items():
        moved = (value - start[key]).abs().max().item()
        assert moved > 0 or "rotary" in key or "norm" in key, key  # the update moved it
        assert torch.allclose(value, models[1].state_dict()[key], rtol=0, atol=1e-3 * moved), key


def auto_resume_worker(rank, world, port, settings):
    """A process of a 2-process --auto-resume start that notes whether it continued from the checkpoint."""
    restore_checkpoint = V.restore_checkpoint

    def noted(setup, state, path):
        Path(settings["run_dir"], f"restored-by-{rank}").write_text(path)
        restore_checkpoint(setup, state, path)

    V.restore_checkpoint = noted
    distributed_worker(rank, world, port, settings)


def test_two_processes_auto_resume_as_the_main_one_decides(tiny, tmp_path):
    """Under torchrun only the main process reads the run folder: with --auto-resume every process continues the run
    when it does (else they would run different iterations, and their collectives would never meet)."""
    import socket as socket_module

    import torch.multiprocessing as mp

    settings = dataclasses.asdict(
        tiny_args(tiny, tmp_path, auto_resume=True, overwrite=False, checkpoint_every=1, micro_batch_size=16)
    )
    for iterations in (1, 2):
        with socket_module.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        started = mp.spawn(auto_resume_worker, args=(2, port, dict(settings, num_iterations=iterations)), nprocs=2, join=False)
        for _ in range(60):  # a hang (the processes in different iterations) fails here, not the whole suite
            if started.join(timeout=5):
                break
        else:
            for process in started.processes:
                process.kill()
            pytest.fail("the two processes did not finish: they ran different iterations")
    history = json.loads(Path(settings["run_dir"], "history.json").read_text())
    assert [record["iteration"] for record in history["iterations"]] == [1, 2]
    assert sorted(path.name for path in Path(settings["run_dir"]).glob("restored-by-*")) == ["restored-by-0", "restored-by-1"]


# ---------------------------------------------------------------- the synthetic arithmetic task


def test_arith_task_is_gsm8k_schema_deterministic_and_disjoint(tmp_path):
    from tools.studies.make_arith_task import make_task

    train, test = make_task(str(tmp_path / "a"), 300, 50, seed=3)
    again, _ = make_task(str(tmp_path / "b"), 300, 50, seed=3)
    assert Path(train).read_text() == Path(again).read_text()
    train_rows, test_rows = V.load_jsonl(train), V.load_jsonl(test)
    assert len(train_rows) == 300 and len(test_rows) == 50
    assert not {q for q, _ in train_rows} & {q for q, _ in test_rows}
    for line in Path(train).read_text().splitlines():
        record = json.loads(line)
        left, _, right = record["answer"].split("\n")[0].partition(" = ")
        a, op, b = left.split()
        assert int(right) == {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op] >= 0
        assert V.reference_answer(record["answer"]) == int(right) and V.compute_reward(record["answer"], int(right)) == 1


def test_proxy_tool_parallel_workers_match_one_worker_and_resume(tmp_path):
    """tools/studies/gsm8k_proxy_task.py end to end, tiny: --workers 2 gives the runs of --workers 1 (each run is
    seeded and single-threaded), and a rerun into the same --work reuses every finished run."""
    import csv

    def tool(out, work, workers):
        cmd = [sys.executable, "-m", "tools.studies.gsm8k_proxy_task", "--out", str(out), "--work", str(work)]
        cmd += ["--lags", "1", "2", "--seeds", "1", "--total-steps", "2", "--sft-max-steps", "2"]
        cmd += ["--prompts-per-step", "2", "--num-generations", "4", "--eval-every", "2", "--eval-size", "4"]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        proc = subprocess.run(
            cmd + ["--workers", str(workers)], capture_output=True, text=True, timeout=600, env=env, cwd=ROOT
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        with open(out / "runs.csv") as handle:
            return list(csv.DictReader(handle)), json.loads((out / "setup.json").read_text())

    one, setup = tool(tmp_path / "one", tmp_path / "work_one", 1)
    two, _ = tool(tmp_path / "two", tmp_path / "work_two", 2)
    assert [(r["loss"], r["K"]) for r in one] == [("ppo-clip", "1"), ("ppo-clip", "2"), ("vaco", "1"), ("vaco", "2")]
    assert one == two and setup["runs_computed"] == 4
    assert (tmp_path / "one" / "forward_lag.png").is_file()
    table = [line for line in (tmp_path / "one" / "summary.md").read_text().splitlines() if line.startswith("| ")]
    assert [line.split("|")[1:3] for line in table[1:]] == [
        [" ppo-clip ", " 1 "],
        [" ppo-clip ", " 2 "],
        [" vaco ", " 1 "],
        [" vaco ", " 2 "],
    ]
    # At K = 1 the ratio is exactly 1: PPO-clip and VACO take the same steps.
    assert {k: v for k, v in one[0].items() if k not in ("loss", "over_budget_fraction")} == {
        k: v for k, v in one[2].items() if k not in ("loss", "over_budget_fraction")
    }
    again, setup = tool(tmp_path / "one", tmp_path / "work_one", 1)
    assert again == one and setup["runs_computed"] == 0


def test_proxy_summary_table_hand_worked():
    """summary.md: late accuracy = the mean of the evaluations from step total/2 on, per seed, then the mean
    and t-interval over seeds; the change is late minus start."""
    from tools.studies.gsm8k_proxy_task import summary_markdown

    row = dict(loss="vaco", K=2, accuracy_start=0.2, dropped_fraction=0.01, tv_final=0.02)
    runs = [
        dict(row, seed=1, accuracy_end=0.4, over_budget_fraction=0.5, filter_fraction_when_over=0.3),
        dict(row, seed=2, accuracy_end=0.2, over_budget_fraction=0.0, filter_fraction_when_over=""),
    ]
    accuracies = {1: [0.2, 0.1, 0.3, 0.4], 2: [0.2, 0.5, 0.1, 0.2]}  # at steps 0, 4, 8, 12 (late: steps 8, 12)
    curves = [
        dict(loss="vaco", K=2, seed=s, step=4 * i, accuracy=a) for s, acc in accuracies.items() for i, a in enumerate(acc)
    ]
    line = summary_markdown(runs, curves, 16).splitlines()[-1]
    cells = [c.strip() for c in line.split("|")[1:-1]]
    # late: seed 1 (0.3 + 0.4) / 2 = 0.35, seed 2 (0.1 + 0.2) / 2 = 0.15; mean 0.25, t(1) = 12.706, sd 0.1414
    half = 12.706 * 0.141421 / 2**0.5
    assert cells[:3] == ["vaco", "2", "2"]
    assert cells[4] == f"0.250 [{0.25 - half:.3f}, {0.25 + half:.3f}]"
    assert cells[5].startswith("0.050 [")
    assert cells[6:] == ["0.0100", "0.2500", "0.300", "0.0200"]


# ---------------------------------------------------------------- what a user of a real model sees


def test_completions_logged_and_no_signal_said(tiny, tmp_path, capsys):
    """GSM8k's own reward is 0 for every completion of a random model: no group has reward variance. The run says so
    at its third such iteration (once), and the sampled completions go to TensorBoard with their rewards."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    args = tiny_args(tiny, tmp_path, num_iterations=4, log_completions_every=2, num_completions_to_log=3)
    history = V.main(args)
    out = capsys.readouterr().out
    assert all(r["zero_std_fraction"] == 1.0 for r in history["iterations"])
    warnings = [line for line in out.splitlines() if line.startswith("warning: no learning signal")]
    assert len(warnings) == 1, out
    assert "last 3 iterations" in warnings[0] and "--num-generations" in warnings[0] and "--max-new-tokens" in warnings[0]
    assert out.index(warnings[0]) > out.index("iter 3/4") and out.index(warnings[0]) < out.index("iter 4/4")
    assert re.search(r"iter 1/4 .* len \d+ truncated \d\.\d\d ", out), out
    (events,) = glob.glob(str(tmp_path / "run" / "events.out.tfevents.*"))
    accumulator = EventAccumulator(events, size_guidance={"tensors": 0})
    accumulator.Reload()
    logged = accumulator.Tensors("completions/text_summary")
    assert [event.step for event in logged] == [1, 2, 4]  # iterations 1, 2 and 4: one optimizer step each
    text = logged[0].tensor_proto.string_val[0].decode()
    assert text.count("reward 0, advantage +0.000") == 3 and "**4." not in text
    assert PROBLEMS[0][0] in text or any(question in text for question, _ in PROBLEMS)


def test_completions_table_in_wandb_matches_tensorboard(tiny, tmp_path):
    """--track (wandb offline, nothing sent): the `completions` table wandb wrote, read back from the offline run's
    files, holds the rows logged to TensorBoard's text `completions`, at the same steps, with their rewards and
    advantages (a reward with variance, the digit fraction, so the advantages are not all 0)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    env = dict(os.environ, WANDB_MODE="offline", WANDB_DIR=str(tmp_path), HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    program = "import sys, vaco_gsm8k as V, tools.tiny_gsm8k as T; V.compute_reward = T.digit_fraction; V.main(V.parse_args())"
    command = [sys.executable, "-c", program, "--model-id", tiny["llama"], "--data-file", tiny["data"], "--eval-every=0"]
    command += ["--run-dir", str(tmp_path / "run"), "--num-iterations=3", "--prompts-per-step=2", "--num-generations=4"]
    command += ["--micro-batch-size=8", "--max-new-tokens=8", "--torch-threads=1", "--track=True"]
    command += ["--log-completions-every=2", "--num-completions-to-log=6"]
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]

    (events,) = glob.glob(str(tmp_path / "run" / "events.out.tfevents.*"))
    accumulator = EventAccumulator(events, size_guidance={"tensors": 0})
    accumulator.Reload()
    logged = {}
    for event in accumulator.Tensors("completions/text_summary"):
        blocks = re.findall(
            r"\*\*\d+\. reward (\S+), advantage (\S+)\*\*\n\nprompt:\n\n    (.*?)\n\ncompletion:\n\n    (.*?)(?=\n\n\*\*|$)",
            event.tensor_proto.string_val[0].decode(),
            re.S,
        )
        logged[event.step] = [
            (prompt.replace("\n    ", "\n"), completion.replace("\n    ", "\n"), float(reward), float(advantage))
            for reward, advantage, prompt, completion in blocks
        ]
    assert sorted(logged) == [1, 2] and all(len(rows) == 6 for rows in logged.values())  # iterations 1 and 2

    (offline,) = glob.glob(str(tmp_path / "wandb" / "offline-run-*"))
    tables = {}
    for path in glob.glob(os.path.join(offline, "files", "media", "table", "completions_*.table.json")):
        table = json.loads(Path(path).read_text())
        assert table["columns"] == ["step", "prompt", "completion", "reward", "advantage"]
        (step,) = {row[0] for row in table["data"]}
        tables[step] = table["data"]
    assert sorted(tables) == sorted(logged)
    for step, rows in tables.items():
        assert [(prompt, completion) for _, prompt, completion, _, _ in rows] == [row[:2] for row in logged[step]]
        assert [reward for *_, reward, _ in rows] == pytest.approx([row[2] for row in logged[step]], abs=1e-6)
        assert [advantage for *_, advantage in rows] == pytest.approx([row[3] for row in logged[step]], abs=5e-4)
    assert any(advantage != 0 for rows in tables.values() for *_, advantage in rows)


def test_prompt_and_data_fields_from_flags(tiny, tmp_path):
    data = tmp_path / "own.jsonl"
    data.write_text(json.dumps({"problem": "What is 2 + 3?", "solution": "2 + 3 = 5\n#### 5"}) + "\n")
    assert V.load_jsonl(str(data), ("problem", "solution")) == [("What is 2 + 3?", 5.0)]
    _, tokenizer = load_tiny(tiny["llama"])
    args = V.Args(instruction="Be brief.", system_prompt="You add.")
    text = tokenizer.decode(V.encode_prompt(tokenizer, "What is 2 + 3?", args))
    assert text == "<bos>[system] You add.\n[user] What is 2 + 3?\nBe brief.\n[assistant] "
    plain = tokenizer.decode(V.encode_prompt(tokenizer, "What is 2 + 3?", V.Args(instruction="", chat_template=False)))
    assert plain == "Question: What is 2 + 3?\nAnswer:"
    default = tokenizer.decode(V.encode_prompt(tokenizer, "q"))
    assert default == f"<bos>[user] q\n{V.INSTRUCTION}\n[assistant] "
    args = V.parse_args(["--model-id", tiny["llama"], "--question-field", "problem", "--answer-field", "solution"])
    assert (args.question_field, args.answer_field) == ("problem", "solution")
    history = V.main(tiny_args(tiny, tmp_path, data_file=str(data), question_field="problem", answer_field="solution"))
    assert len(history["iterations"]) == 1


def test_local_model_that_is_not_a_model_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("empty").mkdir()
    expect_usage_error(capsys, lambda: V.parse_args(["--model-id", "empty"]), "neither config.json", ".gguf")
    Path("two").mkdir()
    for name in ("a.gguf", "b.gguf"):
        Path("two", name).write_bytes(b"GGUF")
    expect_usage_error(capsys, lambda: V.parse_args(["--model-id", "two"]), "several .gguf files (a.gguf, b.gguf)")
    expect_usage_error(capsys, lambda: V.parse_args(["--model-id", "two/c.gguf"]), "no such model folder or .gguf file")
    real_find_spec = V.importlib.util.find_spec
    monkeypatch.setattr(V.importlib.util, "find_spec", lambda name: None if name == "gguf" else real_find_spec(name))
    expect_usage_error(capsys, lambda: V.parse_args(["--model-id", "two/a.gguf"]), "needs the packages gguf")
    monkeypatch.undo()
    expect_usage_error(capsys, lambda: V.load_model_and_tokenizer(str(tmp_path / "two" / "a.gguf")), "a.gguf: ")


def test_policy_buffer_holds_tied_weights_once(tiny):
    model, _ = load_tiny(tiny["llama"])
    assert model.config.tie_word_embeddings
    copy_ = V.snapshot(model)
    assert copy_["lm_head.weight"] is copy_["model.embed_tokens.weight"]
    assert all(torch.equal(copy_[key], value) for key, value in model.state_dict().items())
    assert copy_["lm_head.weight"].data_ptr() != model.lm_head.weight.data_ptr()
