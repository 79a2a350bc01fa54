"""The calibrated fabric verdict (config/fabric_references.py): the published runs it judges by, the verdict on
them, all_reduce_perf output read back (nccl-tests' layout and the benchmark's), `trainctl fabric verdict`'s
exit status, the benchmark's copy of the table, and the plugin-defeating variables warning."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from config import fabric_references as refs
from config.catalog import CATALOG
from tests.harness import ROOT
from trainctl.cli import app
from trainctl.errors import ExitCode
from trainctl.fleet.fabric import parse_figures
from trainctl.fleet.plugin_knobs import gin_refusal, plugin_knob_warning

GIB = 1024**3
FIXTURES = ROOT / "tests" / "fixtures" / "fabric"
H100_ONE_GPU = ROOT / "tests" / "fixtures" / "nvidia-h100" / "all_reduce_perf-1gpu.txt"
# The published runs, as their sources print them (out-of-place busbw, GB/s).
P5_BATCH = {GIB: 441.81, 2 * GIB: 444.02, 4 * GIB: 475.97, 8 * GIB: 480.43, 16 * GIB: 483.05}
P5_SLURM = {GIB: 436.95, 2 * GIB: 443.72, 4 * GIB: 465.87, 8 * GIB: 479.28, 16 * GIB: 487.09}
P4D_FOUR_EFAS = {GIB: 76.14, 2 * GIB: 77.90}
P4D_ONE_EFA = {GIB: 20.19, 2 * GIB: 20.31}
P4D_NO_EFA = {GIB: 8.15, 2 * GIB: 8.20}


# --------------------------------------------------------------------------------------------- the verdict
@pytest.mark.parametrize("run", [P5_BATCH, P5_SLURM])
@pytest.mark.parametrize("largest", [GIB, 2 * GIB, 8 * GIB, 16 * GIB])
def test_published_p5_pairs_are_healthy_at_every_largest_size(run, largest):
    measured = {size: busbw for size, busbw in run.items() if size <= largest}
    verdict = refs.judge(measured, "p5.48xlarge", 2)
    assert (verdict.word, verdict.message_bytes, verdict.cause) == ("healthy", largest, None)


def test_the_reference_is_the_median_of_the_published_runs_at_the_largest_size():
    verdict = refs.judge({GIB: 400.0, 8 * GIB: 431.0}, "p5.48xlarge", 2)
    # (480.43 + 479.28) / 2 = 479.855; 0.9 x that = 431.87: 431.0 fails, at 8 GiB, not at 1 GiB.
    assert verdict.reference_GBps == pytest.approx(479.855)
    assert (verdict.word, verdict.message_bytes, verdict.busbw_GBps) == ("degraded", 8 * GIB, 431.0)
    assert refs.judge({8 * GIB: 432.0}, "p5.48xlarge", 2).word == "healthy"


@pytest.mark.parametrize(
    ("run", "cause"), [(P4D_ONE_EFA, "fewer EFAs in use"), (P4D_NO_EFA, "no EFA / socket fallback")]
)
def test_published_p4d_runs_on_fewer_efas_or_none_are_degraded_with_the_cause(run, cause):
    verdict = refs.judge(run, "p4d.24xlarge", 2)
    assert (verdict.word, verdict.message_bytes, verdict.cause) == ("degraded", 2 * GIB, cause)
    assert verdict.reason.endswith(f"; likely {cause}")
    assert refs.judge(P4D_FOUR_EFAS, "p4d.24xlarge", 2).word == "healthy"


def test_a_degraded_figure_far_from_every_bad_configuration_names_no_cause():
    # 45 GB/s on p4d: under 90% of four EFAs, far above one (20.31) and none (8.20).
    verdict = refs.judge({2 * GIB: 45.0}, "p4d.24xlarge", 2)
    assert (verdict.word, verdict.cause) == ("degraded", None)
    # p5 has no published bad configuration: degraded, never a guessed cause.
    assert refs.judge({GIB: 110.0}, "p5.48xlarge", 2).cause is None


@pytest.mark.parametrize(
    ("measured", "instance_type", "nodes", "why"),
    [
        (P5_BATCH, "p5en.48xlarge", 2, "no published reference for 2 x p5en.48xlarge"),
        (P5_BATCH, "p5.48xlarge", 4, "no published reference for 4 x p5.48xlarge"),
        ({512 * 1024**2: 390.0}, "p5.48xlarge", 2, "none of the sizes measured has a published reference"),
    ],
)
def test_without_a_reference_the_figures_are_uncalibrated_never_judged(measured, instance_type, nodes, why):
    verdict = refs.judge(measured, instance_type, nodes)
    assert (verdict.word, verdict.message_bytes, verdict.reference_GBps) == ("uncalibrated", None, None)
    assert verdict.reason.startswith(why)


def test_every_reference_cites_a_file_at_a_commit_and_a_known_type():
    assert refs.PUBLISHED
    tests = {refs.NCCL_TESTS_ALL_REDUCE, refs.BENCHMARK_NCCL, refs.BENCHMARK_XLA}
    for row in refs.REFERENCES:
        source = row.source
        assert row.instance_type in CATALOG and row.nodes >= 2 and row.busbw_GBps > 0
        assert row.message_bytes & (row.message_bytes - 1) == 0  # a power of two, as -f 2 sweeps
        assert source.url and source.command and row.test in tests
        assert row.cause in (None, refs.FEWER_EFAS, refs.NO_EFA)
    # The hand-written rows cite a file at a commit (`trainctl fabric record` keeps what --source gives).
    for row in refs.PUBLISHED:
        source = row.source
        assert len(source.commit) == 40 and source.commit in source.url and source.path.split(" ")[0] in source.url
        assert "all_reduce_perf" in source.command and row.test == refs.NCCL_TESTS_ALL_REDUCE
    # A bad configuration is only named where a healthy run of the same type and size is published too.
    healthy = {(r.instance_type, r.nodes, r.message_bytes) for r in refs.REFERENCES if r.cause is None}
    assert all((r.instance_type, r.nodes, r.message_bytes) in healthy for r in refs.REFERENCES if r.cause)


def test_the_observability_page_shows_every_reference_with_its_source():
    page = (ROOT / "docs" / "observability.md").read_text()
    rows = [line for line in page.splitlines() if line.startswith(("| p4", "| p5"))]
    for ref in refs.REFERENCES:
        assert any(
            line.startswith(f"| {ref.instance_type} |") and f"| {ref.busbw_GBps:.2f} |" in line for line in rows
        ), ref
        assert ref.source.path.split(" ")[0] in page and ref.source.commit[:7] in page


def test_the_benchmark_image_carries_the_same_table_and_verdict():
    copy = ROOT / "container" / "benchmark" / "fabric_references.py"
    assert copy.read_bytes() == (ROOT / "config" / "fabric_references.py").read_bytes(), (
        "cp config/fabric_references.py container/benchmark/"
    )
    # The images run Python 3.10 with nothing installed for the benchmark's verdicts.
    tree = ast.parse(copy.read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert {name.split(".")[0] for name in imported} <= sys.stdlib_module_names, imported


# --------------------------------------------------------------------------------------------- reading logs
def test_nccl_tests_output_from_an_h100_is_read_out_of_place():
    figures = parse_figures(H100_ONE_GPU.read_text().splitlines())
    assert [f.bytes for f in figures] == [8 * 2**i for i in range(28)]  # 8 B .. 1 GiB
    # One rank moves nothing (busbw 0); the out-of-place algbw (1505.6), not the in-place one (902911).
    assert all(f.busbw_GBps == 0 for f in figures)
    assert (figures[-1].bytes, figures[-1].algbw_GBps) == (GIB, 1505.6)


def test_tagged_nccl_tests_tables_are_read_whatever_the_launcher_prefix():
    p5 = parse_figures((FIXTURES / "p5-2node-mpirun.txt").read_text().splitlines())
    assert {f.bytes: f.busbw_GBps for f in p5 if f.bytes >= GIB} == P5_BATCH
    p4d = parse_figures((FIXTURES / "p4d-one-efa-srun.txt").read_text().splitlines())
    assert {f.bytes: f.busbw_GBps for f in p4d if f.bytes >= GIB} == P4D_ONE_EFA  # out of place, not in place


BENCHMARK_LOG = """\
[n0] # 2 nodes, 16 ranks, nccl
[n0] #                                                             in-place
[n0] #       size         count      type   redop    root     time   algbw   busbw  #wrong   median
[n0] #        (B)    (elements)                               (us)  (GB/s)  (GB/s)              (us)
[n0]    268435456      67108864     float     sum      -1   1512.4  177.49  332.79       0   1509.8
[n0]    536870912     134217728     float     sum      -1   2633.1  203.89  382.30       0   2630.0
[n0]   1073741824     268435456     float     sum      -1   4391.5  244.50  458.44       0   4390.2
[n0] # Out of bounds values : 0 OK
[n0] # Avg bus bandwidth    : 391.177 (GB/s, sizes >= 268435456 B)
"""


def run_verdict(tmp_path: Path, text: str, *args: str) -> object:
    log = tmp_path / "allreduce.log"
    log.write_text(text)
    return CliRunner().invoke(app, ["fabric", "verdict", str(log), *args])


def test_cli_healthy_on_the_benchmarks_own_table(tmp_path):
    result = run_verdict(tmp_path, BENCHMARK_LOG, "--instance-type", "p5.48xlarge", "--nodes", "2")
    assert result.exit_code == ExitCode.OK, result.output
    first, *table = result.stdout.splitlines()
    assert first == ("healthy: 2 x p5.48xlarge, 458.44 GB/s at 1 GiB against the published 439.38 GB/s (>= 90%)")
    assert table[-1].split() == ["1", "GiB", "244.50", "458.44", "*"] and len(table) == 4


def test_cli_degraded_names_the_cause_and_exits_unhealthy(tmp_path):
    text = (FIXTURES / "p4d-one-efa-srun.txt").read_text()
    result = run_verdict(tmp_path, text, "--instance-type", "p4d.24xlarge", "--nodes", "2")
    assert result.exit_code == ExitCode.UNHEALTHY, result.output
    assert result.stdout.splitlines()[0] == (
        "degraded: 2 x p4d.24xlarge, 20.31 GB/s at 2 GiB against the published 77.62 GB/s (< 90%); "
        "likely fewer EFAs in use"
    )


def test_cli_uncalibrated_prints_the_figures_and_exits_unhealthy(tmp_path):
    text = (FIXTURES / "p5-2node-mpirun.txt").read_text()
    result = run_verdict(tmp_path, text, "--instance-type", "p6-b200.48xlarge", "--nodes", "2")
    assert result.exit_code == ExitCode.UNHEALTHY, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "uncalibrated: 2 x p6-b200.48xlarge, no published reference for 2 x p6-b200.48xlarge"
    assert [line.split()[-1] for line in lines[2:]][-5:] == ["441.81", "444.02", "475.97", "480.43", "483.05"]
    assert "*" not in result.stdout  # nothing judged


def test_cli_json_carries_the_verdict_and_the_figures(tmp_path):
    log = tmp_path / "run.log"
    log.write_text(BENCHMARK_LOG)
    result = CliRunner().invoke(
        app, ["--json", "fabric", "verdict", str(log), "--instance-type", "p5.48xlarge", "--nodes", "2"]
    )
    assert result.exit_code == ExitCode.OK, result.output
    out = json.loads(result.stdout)
    assert (out["verdict"], out["bytes"], out["busbwGBps"], out["cause"]) == ("healthy", GIB, 458.44, None)
    assert out["referenceGBps"] == pytest.approx((441.81 + 436.95) / 2)
    assert [f["bytes"] for f in out["figures"]] == [GIB // 4, GIB // 2, GIB]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("NCCL INFO Bootstrap : Using eth0\n# Avg bus bandwidth    : 0\n", "no all_reduce_perf rows in "),
        (None, "cannot read LOG "),
    ],
)
def test_cli_refuses_a_log_without_rows_in_one_line(tmp_path, text, says):
    log = tmp_path / "empty.log"
    if text is not None:
        log.write_text(text)
    result = CliRunner().invoke(app, ["fabric", "verdict", str(log), "--instance-type", "p5.48xlarge", "--nodes", "2"])
    assert result.exit_code == ExitCode.USAGE, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"trainctl: {says}")


# --------------------------------------------------------------------------------------------- plugin knobs
def definition(instance_type: str, environment: dict[str, str] | None = None) -> dict[str, object]:
    container = {
        "instanceType": instance_type,
        "environment": [{"name": k, "value": v} for k, v in (environment or {}).items()],
    }
    return {"nodeProperties": {"nodeRangeProperties": [{"targetNodes": "0:", "container": container}]}}


@pytest.mark.parametrize(
    "name", ["FI_PROVIDER", "FI_EFA_USE_DEVICE_RDMA", "FI_EFA_FORK_SAFE", "NCCL_PROTO", "NCCL_ALGO"]
)
def test_each_plugin_defeating_variable_is_named_on_nvidia_only(name):
    warning = plugin_knob_warning(definition("p5.48xlarge"), {name: "1", "TASK": "x"})
    assert warning is not None and warning.startswith(f"warning: {name} set for an NVIDIA fleet: ")
    assert "\n" not in warning and "aws-ofi-nccl/blob/master/doc/efa-env-var.md" in warning
    assert plugin_knob_warning(definition("trn1.32xlarge"), {name: "1"}) is None
    assert plugin_knob_warning(definition("p5.48xlarge"), {"TASK": "x", "NCCL_DEBUG": "INFO"}) is None


@pytest.mark.parametrize(
    ("instance_type", "value", "refused"),
    [
        # EFA-GDA (5): P5en, P6-B200, P6-B300 only (aws-ofi-nccl doc/gin-getting-started.md).
        ("p5en.48xlarge", "5", False),
        ("p6-b300.48xlarge", "5", False),
        ("p5.48xlarge", "5", True),
        # Proxy mode: where platform-aws.cpp defaults the plugin to its RDMA protocol.
        ("p5.48xlarge", "3", False),
        ("g7e.48xlarge", "3", False),
        ("p4d.24xlarge", "3", True),
        ("g6.12xlarge", "3", True),
        ("g7e.8xlarge", "3", True),
    ],
)
def test_gpu_initiated_networking_is_refused_where_the_plugin_cannot_do_it(instance_type, value, refused):
    line = gin_refusal(definition(instance_type), {"NCCL_GIN_TYPE": value})
    assert (line is not None) is refused
    if line is not None:
        assert line.startswith(f"NCCL_GIN_TYPE={value}: ") and instance_type in line and "\n" not in line
        assert len(f"trainctl: {line}") <= 200
        assert "gin-getting-started.md" in line


def test_gin_stays_off_unasked_and_a_type_that_cannot_be_told_is_not_refused():
    assert gin_refusal(definition("g6.12xlarge"), {"NCCL_DEBUG": "INFO"}) is None
    assert gin_refusal({"nodeProperties": {"nodeRangeProperties": [{"container": {}}]}}, {"NCCL_GIN_TYPE": "5"}) is None


def test_a_type_outside_the_catalog_counts_as_nvidia_by_its_gpu_check():
    assert plugin_knob_warning(definition("g7.2xlarge", {"EXPECTED_GPUS": "1"}), {"NCCL_ALGO": "Ring"})
    assert plugin_knob_warning(definition("x9.2xlarge"), {"NCCL_ALGO": "Ring"}) is None
