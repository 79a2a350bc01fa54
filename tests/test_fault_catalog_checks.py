"""The fault catalog's checks on hand-made reports: what they accept and what they refuse."""

from __future__ import annotations

from trainctl.rehearsal.catalog_checks import resumed_from_snapshot_epoch
from trainctl.rehearsal.report import RESUMED_LINE


def report(*resumed: str) -> dict:
    return {"jobs": [{"attempts": [{"resumed": text} for text in resumed]}]}


def test_the_ddp_tutorials_resume_line_is_what_the_report_quotes():
    line = "[default0]:Resuming training from snapshot at Epoch 3"
    match = RESUMED_LINE.search(line)
    assert match is not None and match.group(1) == "Resuming training from snapshot at Epoch 3"


def test_a_resume_from_the_snapshot_counts_only_on_the_last_attempt_and_from_the_epoch_asked():
    check = resumed_from_snapshot_epoch(1)
    assert check.test(
        report("node 0 restored 0 files", "node 0 restored 1 file; Resuming training from snapshot at Epoch 3")
    )
    assert not check.test(report("Resuming training from snapshot at Epoch 3", "node 0 restored 0 files"))
    assert not check.test(report("x", "Resuming training from snapshot at Epoch 0"))
    assert resumed_from_snapshot_epoch(4).test(report("Resuming training from snapshot at Epoch 3")) is False
