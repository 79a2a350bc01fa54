"""`make bench`: synth time of the whole app (cdk-nag on) against an empty CDK app, and the
wall time of the test suite. One run on this machine; medians over --runs synths."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CDK = str(ROOT / "node_modules" / ".bin" / "cdk")


def timed(cmd: list[str], check: bool = True) -> tuple[float, int]:
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, check=check, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start, done.returncode


def median_synth(app_args: list[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as out:
            times.append(timed([CDK, "synth", "--quiet", "--output", out, *app_args])[0])
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    os.environ.setdefault("CDK_DISABLE_CLI_TELEMETRY", "true")

    empty = median_synth(["--app", f"{sys.executable} bench/empty_app.py"], args.runs)
    full = median_synth([], args.runs)
    tests, status = timed([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], check=False)

    print(f"cores: {os.cpu_count()}")
    print(f"empty app synth, median of {args.runs}: {empty:.2f} s")
    print(f"full app synth (cdk-nag on), median of {args.runs}: {full:.2f} s")
    print(f"ratio full/empty: {full / empty:.2f} (target <= 2.00)")
    verdict = "passed" if status == 0 else f"FAILED (exit {status})"
    print(f"test suite wall time: {tests:.1f} s, {verdict} (target <= 60 s)")


if __name__ == "__main__":
    main()
