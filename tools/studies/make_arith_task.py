"""A synthetic arithmetic task in GSM8k's JSONL schema: templated one-step word problems with `#### N` answers.

Each line is {"question": ..., "answer": "<a> <op> <b> = <c>\\n#### <c>"}, the schema of openai/gsm8k, so
vaco_gsm8k.py reads it with --data-file / --eval-data-file. Small numbers and one operation per problem
keep it learnable by a tiny character-level model on a CPU (tools/studies/gsm8k_proxy_task.py). The same seed
gives the same files.

Usage:
    python -m tools.studies.make_arith_task --out-dir runs/arith --train-size 4000 --test-size 200
"""

import argparse
import json
import os
import random

NAMES = ["Tom", "Ann", "Sue", "Bob", "Mia", "Leo", "Eva", "Max"]
ITEMS = ["apples", "pens", "cards", "eggs", "books", "coins"]
TEMPLATES = {
    "+": "{name} has {a} {item} and gets {b} more. How many {item} now?",
    "-": "{name} has {a} {item} and gives away {b}. How many {item} are left?",
    "*": "{name} buys {a} bags of {b} {item}. How many {item} in all?",
}


def make_problem(rng: random.Random, max_number: int) -> dict:
    op = rng.choice(sorted(TEMPLATES))
    a, b = rng.randint(1, max_number), rng.randint(1, max_number)
    if op == "-" and b > a:
        a, b = b, a
    c = {"+": a + b, "-": a - b, "*": a * b}[op]
    question = TEMPLATES[op].format(name=rng.choice(NAMES), item=rng.choice(ITEMS), a=a, b=b)
    return {"question": question, "answer": f"{a} {op} {b} = {c}\n#### {c}"}


def write_split(path: str, size: int, rng: random.Random, max_number: int, avoid: set) -> set:
    questions = set()
    with open(path, "w", encoding="utf-8") as handle:
        while len(questions) < size:
            problem = make_problem(rng, max_number)
            if problem["question"] in avoid or problem["question"] in questions:
                continue
            questions.add(problem["question"])
            handle.write(json.dumps(problem) + "\n")
    return questions


def make_task(out_dir: str, train_size: int, test_size: int, seed: int = 0, max_number: int = 9) -> tuple[str, str]:
    """Write train.jsonl and test.jsonl (no question in both) to `out_dir`; returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    rng = random.Random(seed)
    test = os.path.join(out_dir, "test.jsonl")
    train = os.path.join(out_dir, "train.jsonl")
    held_out = write_split(test, test_size, rng, max_number, set())
    write_split(train, train_size, rng, max_number, held_out)
    return train, test


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--train-size", type=int, default=4000)
    parser.add_argument("--test-size", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-number", type=int, default=9, help="operands are drawn from 1..max-number")
    options = parser.parse_args()
    distinct = len(NAMES) * len(ITEMS) * len(TEMPLATES) * options.max_number**2
    if options.train_size + options.test_size > distinct // 2:
        parser.error(f"at most {distinct // 2} problems for --max-number {options.max_number}")
    print(*make_task(options.out_dir, options.train_size, options.test_size, options.seed, options.max_number))


if __name__ == "__main__":
    main()
