"""container/launcher/driver_check.py against a real H100 node's driver files (tests/fixtures), and the
minimums the catalog hands to the job definitions."""

from __future__ import annotations

import subprocess
import sys

import pytest

from config.catalog import CATALOG, MIN_NVIDIA_DRIVER
from tests.harness import ROOT

sys.path.insert(0, str(ROOT / "container" / "launcher"))
import driver_check

# Byte-for-byte copies of what a real H100 node printed (2026-11-23, driver 580.159.04).
FIXTURES = ROOT / "tests" / "fixtures" / "nvidia-h100"
PROC_VERSION = FIXTURES / "proc-driver-nvidia-version.txt"
# What the H100 node ran (FIELD_NOTES, "Measured on a real NVIDIA H100 node").
H100_DRIVER = "580.159.04"


def test_reads_the_driver_of_a_real_node_from_proc_and_nvidia_smi():
    assert driver_check.driver_from_proc(PROC_VERSION.read_text()) == H100_DRIVER
    assert driver_check.drivers_from_smi_csv((FIXTURES / "nvidia-smi-query.csv").read_text()) == [H100_DRIVER]
    # The headerless form names no column: nothing is guessed from it.
    assert driver_check.drivers_from_smi_csv((FIXTURES / "nvidia-smi-query-noheader.csv").read_text()) == []
    # The GCC line below the NVRM line carries a version too; it is not the driver's.
    assert driver_check.driver_from_proc("GCC version:  gcc version 15.3.0 (GCC)\n") is None


def test_versions_compare_as_numbers():
    # As strings, "580.95.05" > "580.159.04"; as versions it is older.
    assert driver_check.older_than("580.95.05", "580.159.04") is not None
    assert driver_check.older_than(H100_DRIVER, "580.95.05") is None
    assert driver_check.older_than("570.133.20", "570.133.20") is None
    with pytest.raises(ValueError):
        driver_check.parse_version("580.xx")


def test_the_h100_node_passes_every_catalog_minimum_and_fails_a_newer_one():
    for minimum in MIN_NVIDIA_DRIVER.values():
        assert driver_check.check(minimum, str(PROC_VERSION)) is None
    problem = driver_check.check("595.58.03", str(PROC_VERSION))
    assert problem is not None and "580.159.04" in problem and "595.58.03" in problem
    assert driver_check.check("", "/nonexistent") is None  # no minimum: nothing to check


def test_command_line_exits_2_with_one_line(tmp_path):
    script = ROOT / "container" / "launcher" / "driver_check.py"
    old = subprocess.run(
        [sys.executable, str(script), "--minimum", "600.1", "--proc-version", str(PROC_VERSION)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert old.returncode == 2 and old.stdout == ""
    (line,) = old.stderr.splitlines()
    assert line.startswith("preflight: NVIDIA driver 580.159.04") and "600.1" in line
    missing = driver_check.main(["--minimum", "580.95.05", "--proc-version", str(tmp_path / "version")])
    assert missing == 2
    assert driver_check.main(["--minimum", "580.95.05", "--proc-version", str(PROC_VERSION)]) == 0


def test_blackwell_types_carry_their_documented_minimum():
    assert CATALOG["p6-b200.48xlarge"].min_nvidia_driver == "570.133.20"
    assert CATALOG["p6-b300.48xlarge"].min_nvidia_driver == "580.95.05"
    for size in ("8xlarge", "12xlarge", "24xlarge", "48xlarge"):
        assert CATALOG[f"g7e.{size}"].min_nvidia_driver == "580.95.05"
        assert CATALOG[f"g7.{size}"].min_nvidia_driver == "580.95.05"
    assert all(s.min_nvidia_driver is None for s in CATALOG.values() if s.accelerator_model in ("H100", "L4", "A100"))
