"""`trainctl rehearse` talks while it runs: the engine's observations become one short line each, in the
order they happened (trainctl/rehearsal/progress.py). Pure tests: a recorded sequence of observations, and
the engine's own observation points on stand-in nodes; no rehearsal runs here."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from trainctl.rehearsal import engine as engine_module
from trainctl.rehearsal.engine import Engine
from trainctl.rehearsal.fleet_facts import FleetFacts
from trainctl.rehearsal.nodes import CONTAINER_VARIABLE, containers_with_ranks
from trainctl.rehearsal.progress import WIDTH, Event, EventPrinter, Narrator, plural

LOGS = "/var/tmp/rehearsal-ab12"  # noqa: S108 - a folder's name in a line, nothing is written
# Seconds on the monotonic clock the recorded observations below were made at; the rehearsal began at T0.
T0 = 1000.0


def narrated(steps: list[tuple[str, tuple[Any, ...]]]) -> list[Event]:
    heard: list[Event] = []
    narrator = Narrator(heard.append)
    narrator.started = T0
    for method, args in steps:
        getattr(narrator, method)(*args)
    return heard


# The engine's observations in a two-node rehearsal whose child is killed after the first checkpoint and
# whose retry resumes (as the kill-child catalog entry runs), each poll's checkpoint list included.
RECORDED = [
    ("begin", ("cdk.out/GpuTrainingJob", "gpu", 2, 3, LOGS)),
    ("attempt_started", (T0, "job-1", 1, 3)),
    ("node_started", (T0, 0, True, "host 0 (i-0, 127.0.0.2)")),
    ("node_started", (T0 + 0.9, 1, False, "host 1 (i-1, 127.0.0.3)")),
    ("rendezvous", (T0 + 4.2, 2)),
    ("checkpoints", (T0 + 8.5, [])),
    ("checkpoints", (T0 + 9.0, ["checkpoint-10.pt"])),
    ("fault", (T0 + 9.1, "fault kill-child@checkpoint:1: SIGKILL node 1's container")),
    ("checkpoints", (T0 + 9.5, ["checkpoint-10.pt"])),
    ("node_ended", (T0 + 9.2, 1, 137, False)),
    ("node_ended", (T0 + 10.6, 0, 75, False)),
    ("attempt_ended", (T0 + 10.7, 1, 75, True, False, "retried: evaluateOnExit entry 4 (RETRY on '75')")),
    ("attempt_started", (T0 + 10.8, "job-1", 2, 3)),
    ("stopping", (T0 + 12.0, "SIGTERM", [], "nothing to stop")),
    ("checkpoints", (T0 + 15.0, ["checkpoint-10.pt", "checkpoint-20.pt", "checkpoint-30.pt"])),
    ("node_ended", (T0 + 20.0, 1, None, True)),
    ("stopping", (T0 + 25.0, "SIGTERM", [1], "the main node ended: Batch stops the other nodes")),
    ("attempt_ended", (T0 + 25.3, 2, 0, True, False, "")),
    ("job_ended", (T0 + 25.3, "job-1", "SUCCEEDED", "Essential container in task exited", 2)),
]


def test_a_recorded_sequence_of_observations_is_told_in_order_once_each():
    heard = narrated(RECORDED)
    assert [(e.at_s, e.kind, e.text) for e in heard] == [
        (0.0, "begin", "rehearsing cdk.out/GpuTrainingJob (fleet gpu): 2 nodes, up to 3 attempts"),
        (0.0, "logs", f"node logs under {LOGS}"),
        (0.0, "attempt", "attempt 1 of up to 3 starts: job job-1"),
        (0.0, "node", "node 0 (main) started on host 0 (i-0, 127.0.0.2)"),
        (0.9, "node", "node 1 started on host 1 (i-1, 127.0.0.3)"),
        (4.2, "rendezvous", "rendezvous complete: training processes run on 2 nodes"),
        (9.0, "checkpoint", "checkpoint-10.pt is in the local S3"),
        (9.1, "fault", "fault kill-child@checkpoint:1: SIGKILL node 1's container"),
        (9.2, "node", "node 1 ended: exit 137"),
        (10.6, "node", "node 0 ended: exit 75"),
        (10.7, "attempt", "attempt 1 ended: main node exit 75; retried: evaluateOnExit entry 4 (RETRY on '75')"),
        (10.8, "attempt", "attempt 2 of up to 3 starts: job job-1"),
        (15.0, "checkpoint", "2 checkpoint files in the local S3: checkpoint-20.pt, checkpoint-30.pt"),
        (20.0, "node", "node 1 ended: no exit code (its host was lost)"),
        (25.0, "stop", "SIGTERM to node 1: the main node ended: Batch stops the other nodes"),
        (25.3, "attempt", "attempt 2 ended: main node exit 0; the job ends"),
        (25.3, "job", "job job-1 SUCCEEDED after 2 attempts (Essential container in task exited)"),
    ]


def test_without_a_listener_nothing_is_said_and_nothing_breaks():
    narrator = Narrator()
    narrator.checkpoints(T0, ["checkpoint-10.pt"])
    narrator.fault(T0, "fault x")  # the fault catalog's case: its stdout is JSON


def test_many_new_checkpoint_files_at_once_are_one_line_naming_the_first_and_last():
    heard = narrated([("checkpoints", (T0 + 1, [f"shard-{i}.pt" for i in range(8)]))])
    assert [e.text for e in heard] == ["8 checkpoint files in the local S3: shard-0.pt ... shard-7.pt"]


def test_the_printer_writes_each_event_as_seconds_and_text_wrapped_within_the_width():
    written: list[str] = []
    printer = EventPrinter(written.append)
    printer(Event(9.1, "fault", "fault kill-child@checkpoint:1: SIGKILL node 1's container"))
    long = "node 1 never started: CannotPullContainerError: " + "pull access denied for the image " * 6
    printer(Event(1234.5, "node", long))
    assert written[0] == "    9.1 s  fault kill-child@checkpoint:1: SIGKILL node 1's container"
    assert written[1].startswith(" 1234.5 s  node 1 never started: CannotPullContainerError:")
    assert len(written) > 2 and all(len(line) <= WIDTH for line in written)
    # The wrapped lines sit under the text, and no word is lost.
    assert all(line.startswith(" " * 11) and line[11] != " " for line in written[2:])
    assert " ".join(line[11:] for line in written[1:]).split() == long.split()


def test_the_printer_remembers_where_the_logs_are_for_an_interrupted_run():
    printer = EventPrinter(lambda line: None)
    assert printer.logs == ""
    for event in narrated(RECORDED[:1]):
        printer(event)
    assert printer.logs == LOGS


def test_plural_says_one_file_and_two_files():
    assert [plural(n, "file") for n in (0, 1, 2)] == ["0 files", "1 file", "2 files"]
    assert [plural(n, "entry", "entries") for n in (1, 3)] == ["1 entry", "3 entries"]


# ------------------------------------------------------------------------ the engine's observation points
class Runtime:
    """Stands in for the process runtime: the checkpoint files each poll finds in the local S3."""

    def __init__(self, polls: list[list[str]]) -> None:
        self.polls = polls

    def checkpoints(self, job: Any) -> list[str]:
        return self.polls.pop(0)


def engine(tmp_path: Path, heard: list[Event], polls: list[list[str]]) -> Engine:
    s3 = SimpleNamespace(describe=None, throttled=0)
    narrator = Narrator(heard.append)
    facts = FleetFacts(30, "test", None, "test")
    built = Engine(runtime=Runtime(polls), s3=s3, faults=[], root=tmp_path, deadline_seconds=60, seed=0,  # type: ignore[arg-type]
                   facts=facts, narrator=narrator)  # fmt: skip
    narrator.started = T0
    return built


def test_the_engine_tells_each_checkpoint_once_in_the_order_s3_showed_them(tmp_path):
    heard: list[Event] = []
    polls = [[], ["checkpoint-10.pt"], ["checkpoint-10.pt"], ["checkpoint-10.pt", "checkpoint-20.pt"]]
    built = engine(tmp_path, heard, polls)
    job = SimpleNamespace(checkpoint_seen={})
    for number in range(4):
        built._checkpoints(job, T0 + number)  # type: ignore[arg-type]
    assert [(e.at_s, e.text) for e in heard] == [
        (1.0, "checkpoint-10.pt is in the local S3"),
        (3.0, "checkpoint-20.pt is in the local S3"),
    ]
    assert job.checkpoint_seen == {"checkpoint-10.pt": T0 + 1, "checkpoint-20.pt": T0 + 3}


def test_the_engine_tells_the_rendezvous_once_every_node_has_its_training_processes(tmp_path, monkeypatch):
    heard: list[Event] = []
    built = engine(tmp_path, heard, [])
    ranked: set[str] = {"token-0"}
    asked: list[set[str]] = []

    def with_ranks(tokens: set[str]) -> set[str]:
        asked.append(set(tokens))
        return tokens & ranked

    monkeypatch.setattr(engine_module, "containers_with_ranks", with_ranks)
    runs = [SimpleNamespace(index=i, running=True, token=f"token-{i}") for i in (0, 1)]
    built._rendezvous(runs, T0 + 1)  # type: ignore[arg-type]
    assert heard == []  # node 1's torchrun still waits for the rendezvous
    ranked = {"token-1"}  # node 0 is not asked about again: it was seen with its processes
    built._rendezvous(runs, T0 + 2)  # type: ignore[arg-type]
    built._rendezvous(runs, T0 + 3)  # type: ignore[arg-type]
    assert [(e.at_s, e.kind) for e in heard] == [(2.0, "rendezvous")]
    assert asked == [{"token-0", "token-1"}, {"token-1"}]


def test_a_container_runs_a_rank_when_one_of_its_processes_has_local_rank(tmp_path):
    base = {"PATH": os.environ["PATH"]}
    ranked = subprocess.Popen(["sleep", "30"], env={**base, CONTAINER_VARIABLE: "tok-a", "LOCAL_RANK": "0"})
    plain = subprocess.Popen(["sleep", "30"], env={**base, CONTAINER_VARIABLE: "tok-b"})
    try:
        assert containers_with_ranks({"tok-a", "tok-b", "tok-c"}) == {"tok-a"}
    finally:
        for process in (ranked, plain):
            process.kill()
            process.wait()
