"""A tiny offline setup for vaco_gsm8k.py: a random causal LM, a character-level tokenizer, GSM8k-style
JSONL and a toy reward.

Nothing is downloaded. Used by the GSM8k tools (tools/studies/gsm8k_*.py, tools/bench/gsm8k_*.py) and the tests.
"""

import json
import string

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from vaco_gsm8k import INSTRUCTION

SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant] {% endif %}"
)

# GSM8k's schema: the answer is a rationale that ends with "#### N".
PROBLEMS = [
    ("Tom has 3 apples and buys 4 more. How many?", "3 + 4 = 7\n#### 7"),
    ("A box holds 12 pens. How many in 3 boxes?", "12 * 3 = 36\n#### 36"),
    ("Sue had $20 and spent $8. How much is left?", "20 - 8 = 12\n#### 12"),
    ("A car goes 60 km/h for 2 hours. How far?", "60 * 2 = 120\n#### 120"),
    ("5 friends share 45 sweets. How many each?", "45 / 5 = 9\n#### 9"),
    ("A shirt costs $15. What do 4 shirts cost?", "15 * 4 = 60\n#### 60"),
    ("Ann reads 25 pages a day. Pages in a week?", "25 * 7 = 175\n#### 175"),
    ("A farm has 1,200 hens and sells 200. Left?", "1200 - 200 = 1000\n#### 1,000"),
]


def make_tokenizer() -> PreTrainedTokenizerFast:
    """One token per printable character, plus pad/bos/eos/unk and a chat template."""
    vocab = {token: i for i, token in enumerate(SPECIALS + list(string.printable))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>"
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    # Whole-phrase tokens keep prompts short (character-level prompts would be ~4x longer and slow the tests).
    tokenizer.add_tokens(["[user] ", "\n[assistant] ", "\n" + INSTRUCTION])
    return tokenizer


def tiny_model(family: str = "llama", seed: int = 0, **overrides):
    """A random causal LM (by default 2 layers, hidden 64; `overrides` change its config) and the tokenizer."""
    tokenizer = make_tokenizer()
    shape = dict(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )
    shape.update(overrides)
    torch.manual_seed(seed)
    if family == "llama":
        return LlamaForCausalLM(LlamaConfig(**shape)), tokenizer
    if family == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(**shape)), tokenizer
    raise ValueError(family)


def write_tiny_model(folder, family: str = "llama", seed: int = 0, **overrides) -> str:
    """Save `tiny_model(family, seed, **overrides)` and its tokenizer to `folder`; returns the folder."""
    model, tokenizer = tiny_model(family, seed, **overrides)
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return str(folder)


def write_gsm8k_jsonl(path, problems=PROBLEMS) -> str:
    with open(path, "w", encoding="utf-8") as handle:
        for question, answer in problems:
            handle.write(json.dumps({"question": question, "answer": answer}) + "\n")
    return str(path)


def digit_fraction(completion: str, reference: float) -> float:
    """A reward a random tiny model can improve on (GSM8k's is always 0 for it): the fraction of digits."""
    return sum(c.isdigit() for c in completion) / max(len(completion), 1)
