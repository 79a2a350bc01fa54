"""NCCL's RAS view in the hang evidence (container/launcher/hang_evidence.py ras_view): ncclras's JSON saved beside
the stacks, the ranks it reports behind named in the hang line, and a missing, hung or unreadable client said in
one line. The fake client prints JSON shaped as NCCL's documentation shows it ("RAS", JSON Output, NCCL 2.28.7
and later; field names as src/ras/client_support.cc writes them at NVIDIA/nccl 5067397)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.test_hang_verdict import report

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "container" / "launcher"))
import hang_evidence as evidence  # noqa: E402
import hang_verdict as verdicts  # noqa: E402


def rank(number: int, all_reduce: int, host: str = "10.0.0.1") -> dict[str, object]:
    return {
        "rank": number,
        "host": host,
        "pid": 4000 + number,
        "cuda_dev": number,
        "nvml_dev": number,
        "status": {"init_state": 0, "async_error": 0, "finalize_called": False, "destroy_flag": False},
        "collective_counts": {"Broadcast": 1, "Reduce": 0, "AllGather": 2, "ReduceScatter": 0, "AllReduce": all_reduce},
    }


# Four ranks of eight answered: two launched one AllReduce fewer; rank 5 gave no data, rank 6 is considered dead.
STUCK = {
    "nccl_version": "2.29.1",
    "timestamp": "2026-11-28 20:10:00",
    "communicators_count": 1,
    "communicators": [
        {
            "hash": "0xae94423cfbb2ef4a",
            "size": 8,
            "ranks_count": 4,
            "missing_ranks_count": 2,
            "ranks": [rank(0, 6650), rank(1, 6650), rank(2, 6649), rank(3, 6649, "10.0.0.2")],
            "missing_ranks": [
                {
                    "rank": 5,
                    "host": "10.0.0.2",
                    "pid": 4005,
                    "status": {"unresponsive": True, "considered_dead": False},
                },
                {"rank": 6, "host": "10.0.0.2", "pid": 4006, "status": {"unresponsive": True, "considered_dead": True}},
            ],
        }
    ],
    "ras": {"collection_time_sec": 2.05, "timeouts_count": 2},
}


def fake_client(tmp_path: Path, body: str) -> dict[str, str]:
    """A PATH holding an `ncclras` that records its arguments and runs `body` (sh)."""
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    client = folder / "ncclras"
    client.write_text(f'#!/bin/sh\necho "$@" > "{tmp_path}/args"\n{body}\n')
    client.chmod(0o755)
    return {"PATH": str(folder)}


def printing(tmp_path: Path, document: object) -> dict[str, str]:
    (tmp_path / "view.json").write_text(document if isinstance(document, str) else json.dumps(document, indent=2))
    return fake_client(tmp_path, f'cat "{tmp_path}/view.json"')


def test_the_view_is_saved_and_the_line_names_the_ranks_behind_and_missing(tmp_path):
    environ = {**printing(tmp_path, STUCK), "NCCL_RAS_ADDR": "10.0.0.1:28100"}
    line = evidence.ras_view(tmp_path / "evidence", environ)
    assert json.loads((tmp_path / "evidence" / evidence.RAS_FILE).read_text()) == STUCK
    assert (tmp_path / "args").read_text().split() == ["-f", "json", "-t", "5", "-h", "10.0.0.1", "-p", "28100"]
    assert line == (
        "RAS (ncclras.json): ranks 2, 3 behind in AllReduce (6649 of 6650, comm 0xae94423cfbb2ef4a); "
        "rank 6 considered dead (comm 0xae94423cfbb2ef4a); rank 5 missing: no data from it (comm 0xae94423cfbb2ef4a)"
    )


def test_a_job_where_every_rank_is_level_says_so(tmp_path):
    level = json.loads(json.dumps(STUCK))
    level["communicators"][0].update(ranks=[rank(0, 7), rank(1, 7)], missing_ranks=[])
    line = evidence.ras_view(tmp_path / "evidence", printing(tmp_path, level))
    assert line == "RAS (ncclras.json): no rank behind in any collective, none missing"
    assert (tmp_path / "args").read_text().split() == ["-f", "json", "-t", "5"]  # NCCL's default address


@pytest.mark.parametrize("shape", ['{"communicators": "none"}', "[1, 2]", "Job summary\n===========\n"])
def test_a_view_of_another_shape_is_saved_not_parsed(tmp_path, shape):
    line = evidence.ras_view(tmp_path / "evidence", printing(tmp_path, shape))
    assert line == "RAS view saved (ncclras.json), not parsed: its shape is not NCCL's documented one"
    assert (tmp_path / "evidence" / evidence.RAS_FILE).read_text() == shape


def test_no_client_or_ras_off_is_one_line_on_nvidia_nodes_and_nothing_elsewhere(tmp_path):
    folder = tmp_path / "bin"
    folder.mkdir()
    assert evidence.ras_view(tmp_path / "evidence", {"PATH": str(folder)}) == ""
    (folder / "nvidia-smi").write_text("#!/bin/sh\n")
    (folder / "nvidia-smi").chmod(0o755)
    assert evidence.ras_view(tmp_path / "evidence", {"PATH": str(folder)}) == "no ncclras in this image: no RAS view"
    off = {**printing(tmp_path, STUCK), "NCCL_RAS_ENABLE": "0"}
    assert evidence.ras_view(tmp_path / "evidence", off) == "RAS is off (NCCL_RAS_ENABLE=0): no RAS view"
    assert not (tmp_path / "evidence").exists()


def test_a_client_that_hangs_is_given_up_on_and_one_that_fails_is_said(tmp_path, monkeypatch):
    monkeypatch.setattr(evidence, "RAS_MARGIN_SECONDS", 0.0)
    hung = fake_client(tmp_path, "exec sleep 30")
    assert evidence.ras_view(tmp_path / "evidence", hung, seconds=0.3) == "RAS: ncclras gave no answer in 0 s"
    failing = fake_client(tmp_path, 'echo "Invalid format: json (must be text)" >&2; exit 1')
    assert evidence.ras_view(tmp_path / "evidence", failing) == (
        "RAS: ncclras failed (exit 1: Invalid format: json (must be text))"
    )
    assert not (tmp_path / "evidence" / evidence.RAS_FILE).exists()


def test_a_view_that_only_moved_its_clock_does_not_change_the_fingerprint(tmp_path):
    (tmp_path / evidence.RAS_FILE).write_text(json.dumps(STUCK))
    before = evidence.fingerprint(tmp_path)
    (tmp_path / evidence.RAS_FILE).write_text(json.dumps({**STUCK, "timestamp": "2026-11-28 20:15:00"}))
    assert evidence.fingerprint(tmp_path) == before
    moved = json.loads(json.dumps(STUCK))
    moved["communicators"][0]["ranks"][2]["collective_counts"]["AllReduce"] = 6650
    (tmp_path / evidence.RAS_FILE).write_text(json.dumps(moved))
    assert evidence.fingerprint(tmp_path) != before


def test_the_hang_line_carries_the_ras_view_of_the_node_that_stopped_first():
    ras = "RAS (ncclras.json): rank 3 behind in AllReduce (6649 of 6650, comm 0x1)"
    reports = {0: report(0, 1000.0, ras="no ncclras in this image: no RAS view"), 1: report(1, 900.0, ras=ras)}
    _code, line = verdicts.verdict(reports, 2, 1, 2000.0) or (None, "")
    assert "node 1 (ranks 1) stopped first" in line and f"; {ras};" in line
    assert "no ncclras" not in line
