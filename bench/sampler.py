"""An in-process CPU sampler for `svir serve`: where a request's CPU time goes, by Python stack.

Sampling profilers that read another process (py-spy) charge a sample to the next system call on
these machines; this one runs inside svir: a `setitimer(ITIMER_PROF)` signal, which only CPU time
advances, records the Python stack it interrupted. svir serves as `svir serve` does; on SIGUSR2
the stacks so far are written, collapsed (`frame;frame;... count`), to `--out`, and a summary by
layer is printed (also when svir returns; not on SIGTERM or SIGINT: uvicorn raises those again
once it has stopped, which ends the process before anything after it runs).

    .venv/bin/python -m bench.sampler --out stacks.txt -- serve --config svir.toml --port 8080
    (drive it with wrk, then kill -USR2 its pid, then stop it)
"""

from __future__ import annotations

import argparse
import collections
import signal
import sys
from pathlib import Path
from types import FrameType

from bench.common import summarize_profile

INTERVAL = 0.0005  # s of CPU time between samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("svir_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    stacks: collections.Counter[str] = collections.Counter()

    def sample(signum: int, frame: FrameType | None) -> None:
        names = []
        while frame is not None:
            code = frame.f_code
            names.append(f"{code.co_name} ({code.co_filename}:{code.co_firstlineno})")
            frame = frame.f_back
        stacks[";".join(reversed(names))] += 1

    def write() -> None:
        args.out.write_text("".join(f"{stack} {n}\n" for stack, n in stacks.items()))
        print(summarize_profile(args.out, top=25), file=sys.stderr)

    signal.signal(signal.SIGPROF, sample)
    signal.signal(signal.SIGUSR2, lambda signum, frame: write())
    signal.setitimer(signal.ITIMER_PROF, INTERVAL, INTERVAL)
    from svir.cli import main as svir_main

    rest = [a for a in args.svir_args if a != "--"]
    try:
        return svir_main(rest) or 0
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        write()


if __name__ == "__main__":
    raise SystemExit(main())
