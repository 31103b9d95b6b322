"""Copy the run's plumbing of ppo_mujoco.py into the three other MuJoCo scripts, or check that they hold it.

Each MuJoCo script ends with the run's plumbing: the lines from the banner "# The run's plumbing: identical in all four
MuJoCo scripts" to the one that closes it ("# End of the run's plumbing."), each with its rule line above and below.
The four copies are byte-identical: a change is made in ppo_mujoco.py, then copied with this command.

    python -m tools.sync_plumbing          # copy ppo_mujoco.py's plumbing into the other three
    python -m tools.sync_plumbing --check  # exit 1 naming each script whose plumbing differs; writes nothing

A script without exactly one pair of banners is an error (exit 2), in either mode.
"""

import argparse
import sys
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
SOURCE = "ppo_mujoco"
TARGETS = ["vaco_mujoco", "spo_mujoco", "impala_mujoco"]
START = "# The run's plumbing: identical in all four MuJoCo scripts"
END = "# End of the run's plumbing."


def plumbing_lines(lines: list[str]) -> Optional[tuple[int, int]]:
    """(first, last + 1): the plumbing's lines, the rule lines around its two banners included; None without exactly
    one opening and one closing banner in that order."""
    starts = [i for i, line in enumerate(lines) if line.startswith(START)]
    ends = [i for i, line in enumerate(lines) if line.startswith(END)]
    if len(starts) != 1 or len(ends) != 1 or not 0 < starts[0] < ends[0] < len(lines) - 1:
        return None
    return starts[0] - 1, ends[0] + 2


def plumbing_section(text: str) -> Optional[str]:
    """The plumbing of a script's text, as one string; None if its banners are missing or repeated."""
    lines = text.splitlines(keepends=True)
    span = plumbing_lines(lines)
    return None if span is None else "".join(lines[span[0] : span[1]])


def sync(root: Path = ROOT, check: bool = False) -> list[str]:
    """The target scripts whose plumbing differs from ppo_mujoco.py's; unless `check`, each gets ppo_mujoco.py's.
    ValueError naming the script whose banners are missing or repeated (then nothing is written)."""
    texts = {name: (root / f"{name}.py").read_text() for name in [SOURCE, *TARGETS]}
    sections = {name: plumbing_section(text) for name, text in texts.items()}
    broken = [f"{name}.py" for name, section in sections.items() if section is None]
    if broken:
        raise ValueError(f"{', '.join(broken)}: no single pair of plumbing banners ({START!r} ... {END!r})")
    differing = [name for name in TARGETS if sections[name] != sections[SOURCE]]
    if not check:
        for name in differing:
            lines = texts[name].splitlines(keepends=True)
            first, last = plumbing_lines(lines)
            (root / f"{name}.py").write_text("".join(lines[:first]) + sections[SOURCE] + "".join(lines[last:]))
    return differing


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a script's plumbing differs")
    args = parser.parse_args(argv)
    try:
        differing = sync(check=args.check)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    files = ", ".join(f"{name}.py" for name in differing)
    if args.check:
        if differing:
            print(f"the plumbing of {files} differs from {SOURCE}.py's: python -m tools.sync_plumbing copies it")
            return 1
        print(f"the plumbing of the {1 + len(TARGETS)} MuJoCo scripts is identical")
        return 0
    print(f"copied {SOURCE}.py's plumbing into {files}" if differing else "nothing to copy: the plumbing is identical")
    return 0


if __name__ == "__main__":
    sys.exit(main())
