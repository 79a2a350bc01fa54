"""`make bench-trainctl`: `trainctl jobs` over a busy queue, against moto's AWS APIs on 127.0.0.1 (the
test world of tests/trainctl_world.py: stack outputs, queues, compute environments).

--jobs jobs go into the gpu fleet's queue, then `trainctl --json jobs --limit 0` lists them all (ListJobs
pages of up to 100, DescribeJobs 100 ids a call), and the default `trainctl jobs` (newest 50, a table).
Medians over --runs, in process. A local server measures trainctl and botocore, not AWS's latency.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from moto.server import ThreadedMotoServer
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.trainctl_world import build_world, moto_environment, tear_down  # noqa: E402
from trainctl.cli import app  # noqa: E402


def timed(runner: CliRunner, args: list[str], env: dict[str, Any], runs: int) -> tuple[float, str]:
    times, output = [], ""
    for _ in range(runs):
        start = time.perf_counter()
        result = runner.invoke(app, args, env=env)
        times.append(time.perf_counter() - start)
        if result.exit_code != 0:
            raise SystemExit(f"trainctl {' '.join(args)} failed: {result.output}")
        output = result.stdout
    return statistics.median(times), output


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3)
    options = parser.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{server.get_host_and_port()[1]}"
    try:
        world = build_world(endpoint)
        batch = world.client("batch")
        queue, definition = world.queues["gpu"], world.training["gpu"]
        start = time.perf_counter()
        for i in range(options.jobs):
            batch.submit_job(jobName=f"bench-{i:05d}", jobQueue=queue, jobDefinition=definition)
        submitting = time.perf_counter() - start
        env = moto_environment(endpoint)
        runner = CliRunner()
        every, output = timed(runner, ["--json", "jobs", "--limit", "0"], env, options.runs)
        listed = len(json.loads(output))
        newest, _ = timed(runner, ["jobs"], env, options.runs)
        print(f"{options.jobs} jobs submitted to the local API in {submitting:.1f} s")
        print(f"trainctl --json jobs --limit 0: {listed} jobs in {every:.2f} s (median of {options.runs})")
        print(f"trainctl jobs (newest 50, table): {newest:.2f} s (median of {options.runs})")
        if listed < options.jobs:
            raise SystemExit(f"listed {listed} of {options.jobs} jobs")
    finally:
        tear_down(endpoint)
        server.stop()


if __name__ == "__main__":
    main()
