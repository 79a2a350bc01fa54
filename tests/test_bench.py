"""`make bench`'s own parts: the three slowest tests read from pytest's output, and the CPU time of the
processes it ran (children, and theirs once reaped)."""

import importlib.util
import subprocess
import sys

from tests.harness import ROOT


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_main", ROOT / "bench" / "bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PYTEST_OUTPUT = """\
........                                                                  [100%]
============================= slowest 3 durations ==============================
33.14s call     tests/test_cfn_lint.py::test_templates_lint_clean[default]
16.03s setup    tests/test_replay.py::test_every_redeploy_updates_in_place[a fleet moves AZ]
12.45s call     tests/test_allreduce.py::test_per_node_check_names_the_slow_node_and_the_fabric_check_follows
=========================== short test summary info ============================
2312 passed, 3 skipped in 110.64s (0:01:50)
"""


def test_slowest_reads_the_durations_table_and_nothing_after_it():
    lines = load_bench().slowest(PYTEST_OUTPUT)
    assert [line.split()[0] for line in lines] == ["33.14s", "16.03s", "12.45s"]
    assert lines[1].endswith("[a fleet moves AZ]")
    assert load_bench().slowest("2312 passed in 1.0s") == []


def test_children_cpu_counts_a_grandchild_once_it_is_reaped():
    bench = load_bench()
    before = bench.children_cpu()
    burn = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass"
    # A shell that runs Python: the CPU is the grandchild's, as pytest's workers are under make.
    subprocess.run(["sh", "-c", f'"{sys.executable}" -c "$0"', burn], check=True)
    assert bench.children_cpu() - before >= 0.3
