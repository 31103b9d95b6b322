"""Clip fraction (PPO-clip) and filter fraction (VACO) against the forward lag, on the tiny offline setup.

The shape to compare with the paper's Figure 5 (docs/method.md §4): PPO-clip clips more as the
forward lag K grows; VACO filters rarely, but a large part of the minibatch when it does.

The setup is a random 2-layer Llama (hidden 64) with a character-level tokenizer
(tools/tiny_gsm8k.py). GSM8k's reward is always 0 for such a model, so it learns the
toy reward `digit_fraction` instead; the learning rate is 1e-3, not the paper's 1e-6, so that one
optimizer step moves this tiny policy measurably. Every run takes the same number of optimizer
steps, so a larger K means fewer, larger generation batches.

Usage:
    python -m tools.studies.gsm8k_lag_table                      # K = 1 2 4 8, seeds 1 2: 5 to 10 min on one core
    python -m tools.studies.gsm8k_lag_table --lags 1 2 --seeds 1 --steps 16
"""

import argparse
import os
import tempfile

import numpy as np
import torch

import vaco_gsm8k as V
from tools.tiny_gsm8k import digit_fraction, write_gsm8k_jsonl, write_tiny_model


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lags", type=int, nargs="+", default=[1, 2, 4, 8], help="forward lags K")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--steps", type=int, default=32, help="optimizer steps per run (a multiple of every K)")
    parser.add_argument("--learning-rate", type=float, default=1e-3)
    options = parser.parse_args()
    if any(options.steps % k for k in options.lags):
        parser.error("--steps must be a multiple of every lag")
    torch.set_num_threads(1)
    V.compute_reward = digit_fraction

    rows = []
    with tempfile.TemporaryDirectory() as folder:
        model = write_tiny_model(os.path.join(folder, "model"))
        data = write_gsm8k_jsonl(os.path.join(folder, "train.jsonl"))
        for loss in ["ppo-clip", "vaco"]:
            for k in options.lags:
                steps, iterations, rewards = [], [], []
                for seed in options.seeds:
                    args = V.Args(
                        model_id=model, data_file=data, run_dir=os.path.join(folder, f"{loss}_{k}_{seed}"),
                        loss=loss, forward_lag=k, num_iterations=options.steps // k, seed=seed,
                        prompts_per_step=4, num_generations=8, micro_batch_size=32, max_new_tokens=16,
                        learning_rate=options.learning_rate, eval_every=0, torch_threads=1,
                    )  # fmt: skip
                    history = V.main(args)
                    steps += history["steps"]
                    iterations += history["iterations"]
                    quarter = max(1, len(history["iterations"]) // 4)
                    rewards += [r["reward"] for r in history["iterations"][-quarter:]]
                rows.append(summarise(loss, k, steps, iterations, rewards))

    print()
    print(f"tiny offline setup, {options.steps} optimizer steps per run, seeds {options.seeds}, lr {options.learning_rate}")
    print(
        "| loss | K | clip or filter fraction, mean over steps | same, at step k = K | minibatches over budget "
        "| filter fraction when over budget | D before step, mean | final TV, mean | reward, last quarter |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


def summarise(loss, k, steps, iterations, rewards):
    key = "clip_fraction" if loss == "ppo-clip" else "filter_fraction"
    dropped = np.array([s[key] for s in steps])
    last = np.array([s[key] for s in steps if s["position"] == k])
    if loss == "vaco":
        over = np.array([s["over_budget"] for s in steps], dtype=bool)
        over_text = f"{over.mean():.3f}"
        when_over = f"{dropped[over].mean():.3f}" if over.any() else "-"
    else:
        over_text, when_over = "-", "-"
    tv = np.mean([s["tv"] for s in steps])
    final_tv = np.mean([r["tv_final"] for r in iterations])
    reward = np.mean(rewards)
    return [loss, str(k), f"{dropped.mean():.4f}", f"{last.mean():.4f}", over_text, when_over, f"{tv:.4f}",
            f"{final_tv:.4f}", f"{reward:.3f}"]  # fmt: skip


if __name__ == "__main__":
    main()
