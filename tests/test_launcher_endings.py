"""How the main node ends an attempt once training failed somewhere (container/launcher/ending.py
after_failure), judged from every child's word, as tables: an application's bug on every rank stays the
application's (1, once), a node fault or a lost child is retried (75), a child killed for memory is the
application's; and the words themselves (failure_text.py: a failed trainer's output, node_watch.py:
what Batch says of a child that said nothing). Whole-process runs: tests/test_node_watch_launcher.py."""

from __future__ import annotations

import sys

import pytest

from tests.harness import ROOT
from tests.test_hang_watch import retried

sys.path.insert(0, str(ROOT / "container" / "launcher"))
import ending
import node_watch
from ending import ChildView, NodeEnd, Report
from failure_text import Failure, read_failure

FIXTURE = ROOT / "tests" / "fixtures" / "torchrun" / "rank1-valueerror.txt"
BUG = Failure(rank=5, when="2026-11-28_13:14:06", error="ValueError: shapes do not match")
ECHO = Failure(rank=0, when="2026-11-28_13:14:05", error="RuntimeError: Connection closed by peer [10.0.0.2]:4100")


def app(node: int, failure: Failure = BUG, code: int = 1) -> NodeEnd:
    return NodeEnd(node, code, f"node {node} (h{node}): {failure.describe(code)}", failure)


def child(node: int, ended: NodeEnd | None = None, batch: str = "", silent: float | None = 1.0) -> ChildView:
    return ChildView(node, ended, batch, silent)


def test_an_application_error_on_every_node_ends_with_its_own_status_once_naming_the_first_rank():
    own = app(0, ECHO)
    children = [child(1, app(1, BUG)), child(2, app(2, ECHO))]
    result = ending.after_failure(first=Report(1, children[0].ended.line), own=own, children=children, waited=2)
    assert result is not None and result.code == 1 and not retried(result.code)
    # The rank whose error is its own is named, though another node's echo came a second earlier.
    assert result.line.startswith("node 1 (h1): rank 5 failed: ValueError: shapes do not match (exit 1)")
    assert "3 of 3 nodes failed with an application error, none with a node fault" in result.line
    assert "(the application's error, not retried)" in result.line
    assert result.mark is None


def test_application_errors_wait_for_every_child_before_deciding():
    children = [child(1, app(1)), child(2, None, silent=2.0)]
    assert ending.after_failure(first=Report(1, "x"), own=None, children=children, waited=5) is None


@pytest.mark.parametrize(
    ("case", "other"),
    [("reported a node fault", child(2, NodeEnd(2, 75, "node 2 (h2): hardware fault: Xid 79"))),
     ("silent since its last alive", child(2, None, silent=ending.LOST_SECONDS)),
     ("never heard from", child(2, None, silent=None))],
)  # fmt: skip
def test_a_lost_or_faulty_child_makes_it_a_node_fault_whatever_the_others_said(case, other):
    children = [child(1, app(1)), other]
    first = Report(75, other.ended.line) if other.ended else Report(1, children[0].ended.line)
    result = ending.after_failure(first=first, own=app(0, ECHO), children=children, waited=ending.LOST_SECONDS)
    assert result is not None and result.code == 75 and retried(75), case
    assert "node 2" in result.line


def test_a_child_batch_shows_ended_is_not_lost_however_silent():
    ended = [child(1, None, batch="SUCCEEDED", silent=None), child(2, app(2), silent=600)]
    result = ending.after_failure(first=None, own=app(0), children=ended, waited=ending.LOST_SECONDS * 3)
    assert result is not None and result.code == 1


def test_a_child_silent_for_less_than_the_limit_is_waited_for():
    children = [child(1, None, silent=ending.LOST_SECONDS - 1)]
    assert ending.after_failure(first=None, own=app(0), children=children, waited=ending.LOST_SECONDS + 5) is None


def test_a_child_alive_but_wordless_at_the_bound_leaves_the_application_error_standing():
    children = [child(1, None, silent=1.0)]
    result = ending.after_failure(first=None, own=app(0), children=children, waited=181, bound=180)
    assert result is not None and result.code == 1
    assert "no word from node 1 after 180 s" in result.line


def test_a_child_killed_for_memory_is_the_applications_as_the_main_nodes_own_oom_kill_is():
    said = "node 1: Batch says FAILED: OutOfMemoryError: Container killed due to memory usage, exit code 137"
    first = Report(137, f"{said}; killed for memory: the application's, not retried")
    children = [child(1, None, batch="FAILED", silent=30)]
    result = ending.after_failure(first=first, own=None, children=children, waited=1)
    assert result is not None and result.code == 137 and not retried(137)
    assert result.line.startswith(said)
    # The kill-main entry's ending: the main node's own SIGKILL is 137, kept, not retried.
    assert ending.after_training(ending.Outcome(137)).code == 137


@pytest.mark.parametrize("code", [75, 2, 78, 124])
def test_a_decisive_report_ends_at_once_without_waiting(code):
    children = [child(1, None, silent=1.0), child(2, None, silent=1.0)]
    result = ending.after_failure(first=Report(code, "node 1: x"), own=None, children=children, waited=0)
    assert result is not None and result.code == code


@pytest.mark.parametrize(
    ("status", "started", "sent"),
    [(0, True, 0), (1, True, 1), (137, True, 137), (2, True, 2), (1, False, 75), (143, False, 75),
     (2, False, 2), (78, False, 78), (75, False, 75)],
)  # fmt: skip
def test_what_a_child_sends_before_and_after_training_starts(status, started, sent):
    assert ending.child_code(status, training_started=started) == sent


def test_a_report_of_an_application_status_keeps_it():
    result = ending.for_report(Report(1, "node 1 (h): rank 2 failed: KeyError: 'x' (exit 1)"))
    assert result.code == 1 and "(the application's, not retried)" in (result.line or "")


def test_the_failure_in_a_real_torchrun_output_names_the_root_cause_rank_and_its_error():
    failure = read_failure(FIXTURE.read_text().splitlines())
    assert failure == Failure(1, "2026-11-28_13:14:06", "ValueError: shapes do not match: (32, 16) vs (16, 8)")
    assert not failure.echo
    # Rank 0 of the same run failed too, with the lost peer's echo: never quoted as rank 1's error.
    silent = read_failure([ln for ln in FIXTURE.read_text().splitlines() if "ValueError" not in ln])
    assert (silent.rank, silent.error) == (1, "")


@pytest.mark.parametrize(
    ("lines", "expected"),
    [(["Traceback (most recent call last):", '  File "t.py", line 3', "KeyError: 'lr'"],
      Failure(None, "", "KeyError: 'lr'")),
     (["[rank0]: RuntimeError: NCCL error: remote process exited", "[rank2]: ZeroDivisionError: division by zero"],
      Failure(2, "", "ZeroDivisionError: division by zero")),
     (["loss 0.1", "done"], Failure(None, "", "")),
     (["/usr/bin/python3: can't open file '/opt/job/trian.py': [Errno 2] No such file or directory",
       "Root Cause (first observed failure):", "[0]:", "  rank      : 0 (local_rank: 0)"],
      Failure(0, "", "/usr/bin/python3: can't open file '/opt/job/trian.py': [Errno 2] No such file or directory")),
     (["torch.distributed.elastic.multiprocessing.errors.ChildFailedError: "], Failure(None, "", ""))],
    ids=["plain python", "the rank with its own error", "no error printed", "a command: naming no file",
         "torchrun's own line is no error"],
)  # fmt: skip
def test_failure_text_without_torchruns_block(lines, expected):
    assert read_failure(lines) == expected


def test_a_lost_peers_echo_is_told_apart():
    assert ECHO.echo and not BUG.echo
    assert Failure(error="torch.distributed.DistBackendError: NCCL communicator was aborted on rank 3").echo


START = 1_000_000


def job(index: int, status: str, code: int | None = None, reason: str = "") -> node_watch.NodeJob:
    return node_watch.NodeJob(index, status, "Essential container in task exited", code, reason, START + 10, START + 20)


def test_batch_failed_for_a_child_that_said_how_it_ended_is_left_to_its_word():
    assert node_watch.verdict([job(1, "FAILED", 1)], START, told=[1]) is None
    code, line = node_watch.verdict([job(1, "FAILED", 1)], START, told=[]) or (0, "")
    assert code == 75 and "died without telling the main node" in line


def test_batch_failed_for_memory_is_the_childs_exit_code_not_a_retry():
    oom = job(2, "FAILED", 137, "OutOfMemoryError: Container killed due to memory usage")
    code, line = node_watch.verdict([oom], START) or (0, "")
    assert code == 137 and "killed for memory: the application's" in line
    assert node_watch.verdict([job(2, "FAILED", None, "OutOfMemoryError: Container killed")], START) == (
        137, "node 2: Batch says FAILED: Essential container in task exited; OutOfMemoryError: Container killed; "
        "killed for memory: the application's, not retried")  # fmt: skip


def test_why_says_a_timed_out_attempt_is_not_retried_and_its_checkpoints_were_uploaded():
    from datetime import UTC, datetime

    from config.job_events import TRAINCTL_CANCEL_REASON
    from trainctl.inspecting.why import explain

    def reasons(status_reason: str) -> list[str]:
        job = {"jobId": "j", "status": "FAILED", "statusReason": status_reason, "attempts": []}
        return explain(job, queue=None, environment=None, instance=None, now=datetime.now(UTC)).reasons

    timed_out = " ".join(reasons("Job attempt duration exceeded timeout"))
    assert "never retries a timed-out job" in timed_out and "with CHECKPOINT_URI the launcher's stop" in timed_out
    assert "cancelled with `trainctl cancel`" in " ".join(reasons(TRAINCTL_CANCEL_REASON))
    assert "never retries" not in " ".join(reasons("Essential container in task exited"))


def test_on_a_retry_a_failed_node_job_that_never_ran_counts_only_after_it_was_seen_otherwise(tmp_path, monkeypatch):
    """How Batch shows a node job between attempts is not documented: on attempt 2 a FAILED entry with no
    times may be attempt 1's (its image never pulled). It counts once the child was seen in another state in
    this attempt, or after STALE_FAILED_SECONDS; on attempt 1 there is no earlier attempt to mistake it for."""
    clock = [1000.0]
    monkeypatch.setattr(node_watch.time, "monotonic", lambda: clock[0])

    def watch(attempt: int) -> node_watch.Watch:
        return node_watch.Watch(client=None, job="j", nodes=2, main=0, pid=1, out=tmp_path / "r",
                                hurry=tmp_path / "h", since=0, period=1, attempt=attempt)  # fmt: skip

    never_ran = node_watch.NodeJob(1, "FAILED", "Task failed to start", None, "CannotPullContainerError: x")
    assert watch(1).this_attempts([never_ran]) == [never_ran]
    retry = watch(2)
    assert retry.this_attempts([never_ran]) == []
    clock[0] += node_watch.STALE_FAILED_SECONDS
    assert retry.this_attempts([never_ran]) == [never_ran]  # it never started again
    seen = watch(2)
    assert seen.this_attempts([node_watch.NodeJob(1, "STARTING")]) == [node_watch.NodeJob(1, "STARTING")]
    assert seen.this_attempts([never_ran]) == [never_ran]
    ran = node_watch.NodeJob(1, "FAILED", "Essential container in task exited", 137, "", 5, 9)
    assert watch(2).this_attempts([ran]) == [ran]  # with times, earlier_attempt decides as before


def test_failures_that_are_all_a_lost_peers_echo_are_a_node_fault_not_the_applications():
    """An EFA link or a GPU gone under every rank: each quotes a broken collective, none an error of its own."""
    echo_main = app(0, ECHO)
    echo_child = app(1, Failure(rank=3, error="torch.distributed.DistBackendError: NCCL communicator was aborted"))
    result = ending.after_failure(first=Report(1, echo_child.line), own=echo_main, children=[child(1, echo_child)],
                                  waited=1)  # fmt: skip
    assert result is not None and result.code == 75 and retried(75)
    assert "none an error of its own" in result.line


def test_the_keepalive_period_is_the_senders():
    import node_fault

    assert ending.ALIVE_SECONDS == node_fault.ALIVE_SECONDS
    assert ending.LOST_SECONDS >= 4 * node_fault.ALIVE_SECONDS
