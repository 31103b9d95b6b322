"""tools/bench/gsm8k_gpu_check.py at a tiny size on a CPU, in seconds: its measurements, its torchrun stage (gloo in
place of NCCL), and its refusal of a bad shape."""

import json
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tools.bench import gsm8k_gpu_check as GC  # noqa: E402
from tools.tiny_gsm8k import write_gsm8k_jsonl  # noqa: E402

torch.set_num_threads(1)


def test_gpu_check_tiny_on_cpu(tmp_path, capsys):
    out = tmp_path / "check.json"
    result = GC.main(["--tiny", "--device", "cpu", "--torch-threads", "1", "--no-torchrun", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert [row["K"] for row in result["runs"]] == [1, 8]
    for row in result["runs"]:
        assert row["generation_tokens_per_s"] > 0 and row["training_tokens_per_s"] > 0 and row["peak_memory_gib"] > 0
        assert row["sequences_per_generation_batch"] == row["K"] * 4 * 4
    assert result["shape"]["hidden_size"] == 32 and result["dtype"] == "fp32"
    assert "| 8 | 128 |" in capsys.readouterr().out
    # The default shape is Qwen2.5-0.5B's: count its parameters from the config alone (meta device, no memory).
    from transformers import Qwen2Config, Qwen2ForCausalLM

    shape = GC.QWEN_05B
    config = Qwen2Config(
        vocab_size=shape["vocab_size"], hidden_size=shape["hidden_size"], intermediate_size=shape["intermediate_size"],
        num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"], num_key_value_heads=shape["kv_heads"],
        tie_word_embeddings=True,
    )  # fmt: skip
    with torch.device("meta"):
        parameters = sum(p.numel() for p in Qwen2ForCausalLM(config).parameters())
    assert abs(parameters - 494_032_768) < 1e6  # Qwen2.5-0.5B's published count (0.49B)


def test_gpu_check_torchrun_one_process_on_cpu(tmp_path):
    """The torchrun stage on a CPU (gloo in place of NCCL): the worker's all-reduce and one training iteration."""
    options = GC.argparse.Namespace(
        device="cpu", torch_threads=1, torchrun_timeout=120, lags=[1], **GC.TINY, **GC.TINY_RUN
    )  # fmt: skip
    model_dir = str(tmp_path / "model")
    GC.build_model_folder(model_dir, options)
    data = write_gsm8k_jsonl(tmp_path / "train.jsonl")
    result = GC.torchrun_check(options, model_dir, data, str(tmp_path))
    assert result["returncode"] == 0, result.get("stderr_tail")
    assert result == {**result, "backend": "gloo", "world_size": 1, "all_reduce_ok": True, "iterations_trained": 1}


def test_gpu_check_bad_shape(capsys):
    with pytest.raises(SystemExit) as stop:
        GC.main(["--tiny", "--heads", "3"])
    assert stop.value.code == 2 and "--hidden-size must be a multiple of --heads" in capsys.readouterr().err
