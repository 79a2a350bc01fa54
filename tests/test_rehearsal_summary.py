"""The rehearsal's summary for a terminal (trainctl/rehearsal/summary.py), rendered from a recorded report:
tools/rehearsal_example.json, one real `trainctl rehearse examples/rehearsal/task.yaml --nodes 2 --fault
kill-child@checkpoint:1` (its child is killed after the first checkpoint, the retry resumes from it), and
variants of it edited here for the endings that run did not have. No rehearsal runs here."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tools import rehearsal_example
from trainctl.cli import app
from trainctl.rehearsal import summary
from trainctl.rehearsal.progress import WIDTH
from trainctl.rehearsal.session import keep_only_logs

RECORDING = rehearsal_example.load()
REPORT: dict[str, Any] = RECORDING["report"]


def report(**changes: Any) -> dict[str, Any]:
    edited = copy.deepcopy(REPORT)
    edited.update(changes)
    return edited


def attempts(of: dict[str, Any]) -> list[dict[str, Any]]:
    return [a for job in of["jobs"] for a in job["attempts"]]


def table_rows(lines: list[str]) -> list[list[str]]:
    """The attempts table's rows as cells (columns are two or more spaces apart; a cell has single spaces),
    each with its note last (why the attempt ended: the lines under the row)."""
    start = next(i for i, line in enumerate(lines) if line.split()[:3] == ["attempt", "start", "end"])
    rows: list[list[str]] = []
    for line in lines[start + 1 :]:
        if re.match(r" +\d+  ", line):  # the attempt's number, under "attempt"
            rows.append([*re.split(r" {2,}", line.strip()), ""])
        elif rows and line.startswith(" " * 10):  # the note, over as many lines as it takes
            rows[-1][-1] = (rows[-1][-1] + " " + line.strip()).strip()
        else:
            break
    return rows


def test_the_recording_is_a_real_two_attempt_story():
    """What the other tests rely on: the recording is the kill-child story it says it is."""
    assert RECORDING["command"][-2:] == ["--fault", "kill-child@checkpoint:1"]
    assert [a["exit_code"] for a in attempts(REPORT)] == [75, 0] and REPORT["as_expected"]
    assert REPORT["logs_dir"] and all(n["log"].startswith(REPORT["logs_dir"]) for a in attempts(REPORT)
                                      for n in a["nodes"])  # fmt: skip


def test_every_line_fits_100_columns_and_none_says_none():
    for lines in (summary.lines(REPORT), rehearsal_example.transcript(RECORDING)):
        assert all(len(line) <= WIDTH for line in lines), max(lines, key=len)
        assert not [line for line in lines if re.search(r"\bNone\b", line)]


def test_the_attempts_table_has_a_row_per_attempt():
    first, second = attempts(REPORT)
    rows = table_rows(summary.lines(REPORT))
    assert [row[:6] for row in rows] == [
        ["1", f"{first['started_s']:.1f} s", f"{first['ended_s']:.1f} s", "75", "nothing",
         str(len(first["checkpoints_completed"]))],
        ["2", f"{second['started_s']:.1f} s", f"{second['ended_s']:.1f} s", "0", "checkpoint-10.pt",
         str(len(second["checkpoints_completed"]))],
    ]  # fmt: skip
    # Why the first ended: the main node's launcher names the killed child; then Batch's retry and its rule.
    assert rows[0][6].startswith("ended: node 1: Batch says FAILED")
    assert rows[0][6].endswith("retried: evaluateOnExit entry 4 (RETRY on '75')")
    assert rows[1][6] == "ended: the main node finished; the job ended"


def test_the_summary_names_the_log_folder_and_each_attempts_logs():
    lines = summary.lines(REPORT)
    folder = REPORT["logs_dir"]
    job = REPORT["jobs"][0]["job_id"]
    at = lines.index(f"node logs under {folder}:")
    assert lines[at + 1 : at + 3] == [
        f"  attempt 1: {job}/attempt-1/node-{{0,1}}.log",
        f"  attempt 2: {job}/attempt-2/node-{{0,1}}.log",
    ]
    assert "node logs: not kept (--clean)" in summary.lines(report(logs_dir=None))


def test_the_verdict_is_the_last_line():
    assert summary.lines(REPORT)[-1] == f"SUCCEEDED in {REPORT['seconds']} s: as expected"
    missed = report(ending="FAILED", as_expected=False, unfired_faults=["cancel@seconds:99"])
    assert summary.lines(missed)[-1].endswith("NOT as expected (expected SUCCEEDED; 1 fault never fired)")
    two = report(as_expected=False, unfired_faults=["a", "b"])
    assert summary.verdict(two).endswith("(2 faults never fired)")


def test_plurals_follow_the_counts():
    one = report()
    first = one["jobs"][0]["attempts"][0]
    first["resumed"] = "node 0 restored 1 file; node 1 restored 0 files"
    one["jobs"][0]["attempts"] = [first]
    first["checkpoints_completed"] = ["checkpoint-10.pt"]
    lines = summary.lines(one)
    assert table_rows(lines)[0][4] == "1 file restored"
    assert "  checkpoints completed in the local S3: 1 file; the newest at the end: checkpoint-10.pt" in lines
    first["resumed"] = "node 0 restored 2 files; node 1 restored 2 files"
    first["checkpoints_completed"] = ["checkpoint-10.pt", "checkpoint-20.pt"]
    lines = summary.lines(one)
    assert table_rows(lines)[0][4] == "4 files restored"
    assert any(line.startswith("  checkpoints completed in the local S3: 2 files;") for line in lines)
    assert summary.lines(report(nodes=1))[0].split(": ", 1)[1].startswith("1 node, ")


def test_endings_without_an_exit_code_or_a_start_are_said_in_words():
    """A lost host, a node that never started, no timeout, no checkpoint: null in the report, words here."""
    lost = report(timeout_seconds=None, detect_s=None, recover_s=None)
    first = lost["jobs"][0]["attempts"][0]
    child = next(n for n in first["nodes"] if not n["main"])
    child.update(exit_code=None, status_reason="Host EC2 (instance i-0abc) terminated.", launcher="")
    never = copy.deepcopy(child)
    never.update(node=2, started_s=None, ended_s=None, exit_code=None, reason="CannotPullContainerError: no",
                 status_reason="Task failed to start", log=str(Path(child["log"]).with_name("node-2.log")))  # fmt: skip
    first["nodes"].append(never)
    first.update(exit_code=None, last_checkpoint=None, checkpoints_completed=[], resumed="")
    lines = summary.lines(lost)
    text = " ".join(" ".join(lines).split())  # wrapped lines joined again
    assert not re.search(r"\bNone\b", text)
    assert "up to 3 attempts, no timeout" in text
    assert "node 1 on " in text and "no exit code (its host was lost)" in text
    assert re.search(r"node 2 on .*: never started, Task failed to start", text)
    assert table_rows(lines)[0][3] == "none"
    assert "/attempt-1/node-{0..2}.log" in text
    assert all(len(line) <= WIDTH for line in lines)


def test_long_values_wrap_within_the_width_and_keep_every_word():
    words = ["--option-" + str(i) for i in range(60)]
    long = report(command=["/opt/training/distributed_run.sh", *words])
    long["jobs"][0]["attempts"][0]["nodes"][0]["launcher"] = "the launcher explains " * 25
    lines = summary.lines(long)
    assert all(len(line) <= WIDTH for line in lines)
    command = lines[lines.index(next(line for line in lines if line.startswith("  command: "))) :]
    said = " ".join(line.strip() for line in command[:8]).removeprefix("command: ").split()
    assert said[: len(words) + 1] == ["/opt/training/distributed_run.sh", *words]


def test_a_resubmitted_jobs_attempts_are_labelled_by_job():
    two = report()
    successor = copy.deepcopy(two["jobs"][0])
    successor.update(job_id="job-2", resubmitted_from=two["jobs"][0]["job_id"])
    two["jobs"].append(successor)
    lines = summary.lines(two)
    assert any(line.startswith("  job 2, attempt 1: ") for line in lines)
    assert any(line.startswith(f"job job-2 (resubmitted from {two['jobs'][0]['job_id']}): ") for line in lines)


@pytest.mark.parametrize(
    ("indexes", "pattern"),
    [([0], "node-0.log"), ([0, 1], "node-{0,1}.log"), (list(range(16)), "node-{0..15}.log"),
     ([0, 2, 5], "node-{0,2,5}.log")],
)  # fmt: skip
def test_node_logs_are_named_as_a_shell_pattern(indexes, pattern):
    assert summary.braces(indexes) == pattern


def test_the_docs_worked_example_is_the_rendering_of_the_recorded_run():
    """docs/rehearsal.md's worked example must be what `make docs-gen` renders today from the recorded run
    (tools/rehearsal_example.json): the command, each event as the printer writes it, the summary.

    Not a byte match of a new run: a rehearsal's ids and times differ every run and it takes 30 s, so the
    run is recorded once (`make docs-example`) and the test renders that recording with the current
    printer and summary. A change of the output's format without `make docs-gen` fails here."""
    page = rehearsal_example.PAGE.read_text()
    assert rehearsal_example.current_block(page) == rehearsal_example.block(RECORDING)
    assert rehearsal_example.main(["--check"]) == 0
    # Any change of what is rendered shows: here, a run one second longer.
    longer = {**RECORDING, "report": report(seconds=REPORT["seconds"] + 1)}
    assert rehearsal_example.current_block(page) != rehearsal_example.block(longer)


def test_the_recorded_events_are_what_a_rehearsal_tells():
    """The recording's events, in order: nodes start, rendezvous, the first checkpoint, the fault, the first
    attempt's end, the retry, the job's end."""
    kinds = [e["kind"] for e in RECORDING["events"]]
    texts = [e["text"] for e in RECORDING["events"]]
    assert kinds[:2] == ["begin", "logs"] and kinds[-1] == "job"
    order = [texts.index(next(t for t in texts if t.startswith(p))) for p in (
        "node 0 (main) started", "rendezvous complete", "checkpoint-10.pt is in", "fault kill-child",
        "attempt 1 ended", "attempt 2 of up to", "job ")]  # fmt: skip
    assert order == sorted(order)
    stamps = [e["at_s"] for e in RECORDING["events"]]
    assert stamps == sorted(stamps)


def test_only_the_node_logs_are_kept(tmp_path):
    attempt = tmp_path / "job" / "attempt-1"
    (attempt / "node-0" / "checkpoints").mkdir(parents=True)
    (attempt / "node-0" / "checkpoints" / "checkpoint-10.pt").write_bytes(b"x" * 100)
    (attempt / "node-0.log").write_text("log\n")
    (tmp_path / "placement-0" / "host-0").mkdir(parents=True)
    (tmp_path / "placement-0" / "host-0" / "take-out").write_text("marker")
    (tmp_path / "placement-0" / "nvidia-smi").symlink_to("/bin/true")
    keep_only_logs(tmp_path)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == [
        "job", "job/attempt-1", "job/attempt-1/node-0.log"]  # fmt: skip


def test_keep_and_clean_together_are_refused_in_one_line(tmp_path):
    result = CliRunner().invoke(app, ["rehearse", str(tmp_path / "task.yaml"), "--keep", str(tmp_path / "k"),
                                      "--clean"])  # fmt: skip
    assert result.exit_code != 0
    err = result.stderr.strip() if result.stderr_bytes is not None else result.output.strip()
    assert err.startswith("trainctl: --keep ") and "--clean" in err and len(err.splitlines()) == 1
