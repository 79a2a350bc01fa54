"""`trainctl fabric record` (trainctl/fleet/fabric_record.py): a healthy run on a type nothing is published for
written into the reference table and its benchmark copy, each refusal in one line, and what the log says about
the run (the test, the NCCL and aws-ofi-nccl versions)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from config import fabric_references as refs
from tests.harness import ROOT
from trainctl.cli import app
from trainctl.errors import ExitCode, TrainctlError
from trainctl.fleet.fabric import parse_figures
from trainctl.fleet.fabric_record import BEGIN, END, TABLE, TABLE_COPY, load_table, log_facts, pick_test

GIB = 1024**3
P5EN_LOG = ROOT / "tests" / "fixtures" / "fabric" / "p5en-2node-nccl-tests.txt"
P5_LOG = ROOT / "tests" / "fixtures" / "fabric" / "p5-2node-mpirun.txt"
# The fixture's out-of-place busbw at 1, 2, 4 and 8 GiB (GB/s).
P5EN_FIGURES = {GIB: 448.35, 2 * GIB: 452.34, 4 * GIB: 484.80, 8 * GIB: 489.25}
SOURCE = "https://github.com/example/fabric-runs/blob/" + "a" * 40 + "/p5en/2node.txt"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A checkout's two copies of the table, as main has them."""
    for relative in (TABLE, TABLE_COPY):
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / TABLE, tmp_path / relative)
    return tmp_path


def run_record(repo: Path, log: Path | str, *args: str) -> object:
    if isinstance(log, str):
        path = repo / "run.log"
        path.write_text(log)
        log = path
    return CliRunner().invoke(app, ["fabric", "record", str(log), "--repo", str(repo), "--source", SOURCE, *args])


def table_of(repo: Path) -> object:
    return load_table((repo / TABLE).read_text(), repo / TABLE)


def test_a_recorded_p5en_pair_calibrates_the_verdict_and_both_copies_stay_identical(repo):
    assert refs.judge(P5EN_FIGURES, "p5en.48xlarge", 2).word == "uncalibrated"
    result = run_record(repo, P5EN_LOG, "--instance-type", "p5en.48xlarge", "--nodes", "2", "--efa-installer", "1.43.1")
    assert result.exit_code == ExitCode.OK, result.output
    assert (repo / TABLE).read_bytes() == (repo / TABLE_COPY).read_bytes()
    table = table_of(repo)
    rows = [row for row in table.REFERENCES if row.instance_type == "p5en.48xlarge"]
    assert {row.message_bytes: row.busbw_GBps for row in rows} == P5EN_FIGURES
    source = rows[0].source
    assert (source.url, source.commit, source.path) == (SOURCE, "a" * 40, "p5en/2node.txt")
    assert (source.nccl, source.aws_ofi_nccl, source.efa_installer) == ("2.27.5", "1.16.3", "1.43.1")
    assert {row.test for row in rows} == {refs.NCCL_TESTS_ALL_REDUCE} and all(row.nodes == 2 for row in rows)
    # The published rows are untouched, and the table now judges a later run of the pair.
    assert [repr(row) for row in table.PUBLISHED] == [repr(row) for row in refs.PUBLISHED]
    later = parse_figures(P5EN_LOG.read_text().splitlines())
    verdict = table.judge({f.bytes: f.busbw_GBps for f in later}, "p5en.48xlarge", 2)
    assert (verdict.word, verdict.message_bytes, verdict.reference_GBps) == ("healthy", 8 * GIB, 489.25)
    assert table.judge({8 * GIB: 489.25 * 0.8}, "p5en.48xlarge", 2).word == "degraded"
    # Recorded once, the pair has a reference: a second run is refused without --replace.
    again = run_record(repo, P5EN_LOG, "--instance-type", "p5en.48xlarge", "--nodes", "2")
    assert again.exit_code == ExitCode.USAGE and "already has a published reference" in again.output


def test_replace_swaps_the_published_healthy_rows_and_keeps_the_bad_configurations(repo):
    log = P5_LOG.read_text().replace("480.43", "470.00")
    result = run_record(repo, log, "--instance-type", "p5.48xlarge", "--nodes", "2", "--replace", "--nccl", "2.23.4")
    assert result.exit_code == ExitCode.OK, result.output
    table = table_of(repo)
    assert table.REPLACED == (("p5.48xlarge", 2),)
    healthy = [row for row in table.REFERENCES if row.instance_type == "p5.48xlarge" and row.cause is None]
    assert {row.source.nccl for row in healthy} == {"2.23.4"}
    assert table.judge({8 * GIB: 470.0}, "p5.48xlarge", 2).reference_GBps == 470.0
    assert len([row for row in table.REFERENCES if row.cause]) == len([row for row in refs.PUBLISHED if row.cause])


P5_ROWS = P5_LOG.read_text()
P5EN_2 = ("--instance-type", "p5en.48xlarge", "--nodes", "2")
P5_2 = ("--instance-type", "p5.48xlarge", "--nodes", "2")


@pytest.mark.parametrize(
    ("log", "args", "says"),
    [
        (
            P5_ROWS,
            ("--instance-type", "p9.48xlarge", "--nodes", "2"),
            "--instance-type p9.48xlarge is not in the catalog",
        ),
        (
            "# nccl-tests version 2.16.4\nno rows here\n",
            ("--instance-type", "p5en.48xlarge", "--nodes", "2"),
            "no all_reduce_perf rows",
        ),
        (
            P5_ROWS,
            ("--instance-type", "p5.48xlarge", "--nodes", "2"),
            "2 x p5.48xlarge already has a published reference",
        ),
        (
            P5_ROWS.replace("483.05", "300.00"),
            (*P5_2, "--replace"),
            "not recorded: the verdict is degraded: 300.00 GB/s at 16 GiB",
        ),
        (
            P5_ROWS.replace("480.43      0", "480.43      3"),
            ("--instance-type", "p5en.48xlarge", "--nodes", "2"),
            "wrong results",
        ),
    ],
    ids=["unknown-type", "no-rows", "has-reference", "degraded", "wrong-results"],
)
def test_each_refusal_is_one_line_and_writes_nothing(repo, log, args, says):
    before = (repo / TABLE).read_bytes()
    result = run_record(repo, log, *args)
    assert result.exit_code == ExitCode.USAGE
    assert says in result.output and len(result.output.strip().splitlines()) == 1, result.output
    assert (repo / TABLE).read_bytes() == before == (repo / TABLE_COPY).read_bytes()


def test_a_version_the_log_contradicts_is_refused(repo):
    result = run_record(repo, P5EN_LOG, "--instance-type", "p5en.48xlarge", "--nodes", "2", "--nccl", "2.26.2")
    assert result.exit_code == ExitCode.USAGE
    assert "--nccl 2.26.2 disagrees with the log, which says 2.27.5" in result.output


def test_the_log_names_its_test_and_versions():
    nccl_tests = log_facts(["# nccl-tests version 2.19.6 nccl-headers=22803 nccl-library=22803"])
    assert (nccl_tests.test, nccl_tests.nccl, nccl_tests.aws_ofi_nccl) == (refs.NCCL_TESTS_ALL_REDUCE, "2.28.3", None)
    benchmark = log_facts(['[n0] {"world_size": 128, "backend": "xla", "nodes": 2}'])
    assert benchmark.test == refs.BENCHMARK_XLA
    assert log_facts(["x NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.13.2-aws"]).aws_ofi_nccl == "1.13.2-aws"


def test_trainium_names_its_own_collective_test():
    assert pick_test(None, refs.BENCHMARK_XLA, "trn2.48xlarge") == refs.BENCHMARK_XLA
    with pytest.raises(TrainctlError, match=r"trn2\.48xlarge is measured by the benchmark's XLA run"):
        pick_test(None, refs.NCCL_TESTS_ALL_REDUCE, "trn2.48xlarge")
    with pytest.raises(TrainctlError, match="give --test"):
        pick_test(None, None, "p5en.48xlarge")


def test_the_repository_table_has_one_recorded_block_in_both_copies():
    for path in (ROOT / TABLE, ROOT / TABLE_COPY):
        lines = path.read_text().splitlines()
        assert lines.count(BEGIN) == 1 and lines.count(END) == 1 and lines.index(BEGIN) < lines.index(END)
