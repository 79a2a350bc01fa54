"""`make bench`: what a user and a contributor wait for, each as a ratio to an empty CDK app's synth
measured by the same CLI in the same run, so that the figures hold on a slower or busier machine:
- synth: the whole app as `cdk synth` runs it (cdk-nag on, CloudFormation's validation only with
  templateValidation=true) over the empty app, timed in turns, median of --runs pairs (target <= 1.6);
- suite: the wall time of `make test` (bootstrap already done) over the empty app's synth, timed
  before and after it (target <= 17, which is 60 s where an empty synth takes 3.5 s), with its three
  slowest tests and its CPU time."""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CDK = str(ROOT / "node_modules" / ".bin" / "cdk")
SYNTH_TARGET = 1.6
SUITE_TARGET = 17.0


def timed(cmd: list[str], check: bool = True) -> tuple[float, int, str]:
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, check=check, capture_output=True, text=True)
    return time.perf_counter() - start, done.returncode, done.stdout


def children_cpu() -> float:
    """CPU seconds (user + system) of every finished child process so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


EMPTY_APP = ["--app", f"{sys.executable} bench/empty_app.py"]


def synth_seconds(app_args: list[str]) -> float:
    with tempfile.TemporaryDirectory() as out:
        return timed([CDK, "synth", "--quiet", "--output", out, *app_args])[0]


def paired_synths(runs: int) -> tuple[list[float], list[float]]:
    """(empty, full) synth times, taken in turns: a machine whose speed drifts (a shared host) moves
    both figures of a pair alike, where timing all of one and then all of the other does not."""
    empty, full = [], []
    for _ in range(runs):
        empty.append(synth_seconds(EMPTY_APP))
        full.append(synth_seconds([]))
    return empty, full


def slowest(pytest_output: str, count: int = 3) -> list[str]:
    """The first `count` lines of pytest's --durations table."""
    lines = pytest_output.splitlines()
    start = next((i for i, line in enumerate(lines) if "slowest" in line and "durations" in line), None)
    if start is None:
        return []
    return [line for line in lines[start + 1 :] if re.match(r"\s*\d+\.\d+s ", line)][:count]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--no-suite", action="store_true", help="synth figures only")
    args = parser.parse_args()
    os.environ.setdefault("CDK_DISABLE_CLI_TELEMETRY", "true")

    empties, fulls = paired_synths(args.runs)
    empty, full = statistics.median(empties), statistics.median(fulls)
    print(f"cores: {os.cpu_count()}")
    print(f"empty app synth, median of {args.runs}: {empty:.2f} s")
    print(f"full app synth (as `cdk synth` runs it), median of {args.runs}: {full:.2f} s")
    ratio = statistics.median(f / e for e, f in zip(empties, fulls, strict=True))
    print(f"synth ratio full/empty, median of the {args.runs} pairs: {ratio:.2f} (target <= {SYNTH_TARGET:.2f})")
    if args.no_suite:
        return
    cpu_before = children_cpu()
    suite, status, output = timed(["make", "test", "ARGS=-p no:cacheprovider --durations=3"], check=False)
    cpu = children_cpu() - cpu_before
    # The empty synth again, right after: the suite is compared with both sides of it.
    after = statistics.median(synth_seconds(EMPTY_APP) for _ in range(args.runs))
    empty = (empty + after) / 2
    print(f"empty app synth after make test, median of {args.runs}: {after:.2f} s (mean of both: {empty:.2f} s)")
    verdict = "passed" if status == 0 else f"FAILED (exit {status})"
    print(f"make test wall time: {suite:.1f} s, {verdict}")
    # Where the suite keeps every core busy, this is the floor of its wall time. Processes their parent
    # never waited for are not counted, so it is a lower bound.
    print(f"make test CPU time: at least {cpu:.0f} s (user + system), {cpu / (os.cpu_count() or 1):.1f} s per core")
    print(f"suite ratio make-test/empty-synth: {suite / empty:.1f} (target <= {SUITE_TARGET:.0f})")
    for line in slowest(output):
        print(f"  slowest: {line.strip()}")


if __name__ == "__main__":
    main()
