"""Copy the common sections of ppo_mujoco.py into the three other MuJoCo scripts, or check that they hold them.

Each MuJoCo script holds two common sections, each from its opening banner to its closing one, the rule lines around
both banners included:
- the environments and the rollout, above `main`: from "# The environments and the rollout: identical in all four
  MuJoCo scripts" to "# End of the environments and the rollout.";
- the run's plumbing, at the end: from "# The run's plumbing: identical in all four MuJoCo scripts" to "# End of the
  run's plumbing.".
The four copies of each are byte-identical: a change is made in ppo_mujoco.py, then copied with this command.

    python -m tools.sync_plumbing          # copy ppo_mujoco.py's common sections into the other three
    python -m tools.sync_plumbing --check  # exit 1 naming each script whose common sections differ; writes nothing

A script without exactly one pair of each section's banners, the sections in this order, is an error (exit 2), in
either mode.
"""

import argparse
import sys
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
SOURCE = "ppo_mujoco"
TARGETS = ["vaco_mujoco", "spo_mujoco", "impala_mujoco"]
# (opening banner, closing banner) of each common section, in the order the scripts hold them.
SECTIONS = [
    ("# The environments and the rollout: identical in all four MuJoCo scripts", "# End of the environments and the rollout."),
    ("# The run's plumbing: identical in all four MuJoCo scripts", "# End of the run's plumbing."),
]


def section_spans(lines: list[str]) -> Optional[list[tuple[int, int]]]:
    """(first, last + 1) of each common section, the rule lines around its two banners included; None without exactly
    one opening and one closing banner of each, the sections in SECTIONS' order and apart."""
    spans = []
    for start, end in SECTIONS:
        starts = [i for i, line in enumerate(lines) if line.startswith(start)]
        ends = [i for i, line in enumerate(lines) if line.startswith(end)]
        if len(starts) != 1 or len(ends) != 1 or not 0 < starts[0] < ends[0] < len(lines) - 1:
            return None
        spans.append((starts[0] - 1, ends[0] + 2))
    if any(earlier[1] > later[0] for earlier, later in zip(spans, spans[1:])):
        return None
    return spans


def common_sections(text: str) -> Optional[list[str]]:
    """The common sections of a script's text, each as one string; None if a banner is missing, repeated or out of
    order."""
    lines = text.splitlines(keepends=True)
    spans = section_spans(lines)
    return None if spans is None else ["".join(lines[first:last]) for first, last in spans]


def sync(root: Path = ROOT, check: bool = False) -> list[str]:
    """The target scripts whose common sections differ from ppo_mujoco.py's; unless `check`, each gets ppo_mujoco.py's.
    ValueError naming the script whose banners are missing, repeated or out of order (then nothing is written)."""
    texts = {name: (root / f"{name}.py").read_text() for name in [SOURCE, *TARGETS]}
    sections = {name: common_sections(text) for name, text in texts.items()}
    broken = [f"{name}.py" for name, section in sections.items() if section is None]
    if broken:
        banners = " and ".join(f"{start!r} ... {end!r}" for start, end in SECTIONS)
        raise ValueError(f"{', '.join(broken)}: not one pair of each section's banners, in order ({banners})")
    differing = [name for name in TARGETS if sections[name] != sections[SOURCE]]
    if not check:
        for name in differing:
            lines = texts[name].splitlines(keepends=True)
            pieces, done = [], 0
            for (first, last), section in zip(section_spans(lines), sections[SOURCE]):
                pieces += [*lines[done:first], section]
                done = last
            (root / f"{name}.py").write_text("".join(pieces + lines[done:]))
    return differing


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a script's common sections differ")
    args = parser.parse_args(argv)
    try:
        differing = sync(check=args.check)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    files = ", ".join(f"{name}.py" for name in differing)
    if args.check:
        if differing:
            print(f"the common sections of {files} differ from {SOURCE}.py's: python -m tools.sync_plumbing copies them")
            return 1
        print(f"the common sections of the {1 + len(TARGETS)} MuJoCo scripts are identical")
        return 0
    print(f"copied {SOURCE}.py's common sections into {files}" if differing else "nothing to copy: the sections are identical")
    return 0


if __name__ == "__main__":
    sys.exit(main())
