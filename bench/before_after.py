"""A request translation of this tree against the same module at another commit, in one process:
the shared plumbing of `bench.anthropic_request` and `bench.ollama_request` (the module before
loaded from git, CPU time per call, instructions per call under callgrind, the command line).
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import subprocess
import sys
import tempfile
import time
import timeit
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def load_before(rev: str, into: Path, module_path: str) -> ModuleType:
    """The module at `module_path` as it was at `rev`, imported from a file of its own."""
    source = subprocess.run(
        ["git", "show", f"{rev}:{module_path}"],
        cwd=ROOT,
        capture_output=True,
        check=True,
        text=True,
    ).stdout
    path = into / "before_request.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("before_request", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cpu_per_call(fn: Any, number: int) -> float:
    """CPU seconds per call of fn over one round (CPU time: the machine's other work moves it less
    than wall time)."""
    return timeit.Timer(fn, timer=time.process_time).timeit(number) / number


def instructions_per_call(bench: str, rev: str, number: int) -> dict[str, float]:
    """Instructions per translation under callgrind (the machine's load does not move them), of
    the module before and after: a run of `python -m <bench> --calls which` making `number` calls
    less a run making none."""
    counts = {}
    for which in ("none", "before", "after"):
        with tempfile.TemporaryDirectory() as tmp:
            run = subprocess.run(
                [
                    *("valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/out"),
                    *(sys.executable, "-m", bench, "--before", rev),
                    *("--calls", which, "--number", str(number)),
                ],
                cwd=ROOT,
                capture_output=True,
                text=True,
                check=True,
            )
        counts[which] = int(re.findall(r"Collected : (\d+)", run.stderr)[-1])
    return {which: (counts[which] - counts["none"]) / number for which in ("before", "after")}


def main(
    argv: list[str] | None,
    doc: str,
    bench: str,
    hand_checked: str,
    *,
    timed: Callable[[str, int, int], None],
    calls: Callable[[str, str, int], None],
    agreement: Callable[[str, int], None],
) -> int:
    """The command line of `python -m <bench>`: CPU time (`timed`) by default, `--instructions`,
    `--agree N` (`agreement`), and the `--calls` (`calls`) a callgrind run makes."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--before", default=hand_checked, help="commit of the translation before")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--number", type=int, default=100, help="calls per round")
    parser.add_argument(
        "--instructions", action="store_true", help="count instructions under callgrind instead"
    )
    parser.add_argument(
        "--agree", type=int, metavar="N", help="compare the answers to N fuzzed bodies instead"
    )
    parser.add_argument("--calls", choices=("none", "before", "after"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.calls:
        calls(args.before, args.calls, args.number)
    elif args.agree:
        agreement(args.before, args.agree)
    elif args.instructions:
        per = instructions_per_call(bench, args.before, args.number)
        print(f"callgrind, {args.number} calls: instructions per translation")
        print(f"  before (hand checks)   {per['before']:12,.0f}")
        print(f"  after (typed)          {per['after']:12,.0f}")
        print(f"after / before: {per['after'] / per['before']:.3f}")
    else:
        timed(args.before, args.rounds, args.number)
    return 0
