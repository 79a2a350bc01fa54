"""The launcher's decisions as tables (container/launcher/ending.py and node_settings.py): every exit
code of the launcher's contract (../shared/DESIGN.md, docs/health.md) from the facts that lead to it,
and every setting from the variables, without starting a process. The whole-process runs are in
tests/test_launcher.py, test_node_faults.py, test_hang_watch.py and the fault catalog."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.harness import ROOT
from tests.test_hang_watch import retried

sys.path.insert(0, str(ROOT / "container" / "launcher"))
import ending
import node_settings
import restore_phase
from ending import Ending, Outcome, Report
from node_settings import BadInput, read_settings

XID = "NVIDIA Xid needing a GPU reset or a new node: 79"
CHILD_LINE = "node 1 (ip-10-0-0-2): preflight failed: expected 4 GPUs, found 3"


# (case, outcome, expected code, expected take-out marker or None, expected line fragment or None)
AFTER_TRAINING = [
    ("success", Outcome(0), 0, None, None),
    ("the application's error stays its own", Outcome(1), 1, None, None),
    ("any application code is kept", Outcome(3), 3, None, None),
    ("the trainer killed (OOM, SIGKILL) is the application's", Outcome(137), 137, None, None),
    ("success whose last upload failed", Outcome(0, upload_failed=True), 1, None, None),
    ("a failure whose last upload failed keeps its code", Outcome(4, upload_failed=True), 4, None, None),
    ("a child's node fault after a failure", Outcome(1, Report(75, CHILD_LINE)), 75, None, "retries it on other nodes"),
    ("Batch's FAILED after a failure", Outcome(1, Report(75, "node 1: Batch says FAILED")), 75, None, "node 1: Batch"),
    ("a child's bad input", Outcome(1, Report(2, "node 1 (h): bad")), 2, None, "exit 2 (not retried)"),
    ("a child's shared fault", Outcome(1, Report(78, "node 1 (h): ami")), 78, None, "exit 78 (not retried)"),
    ("a hang seen again", Outcome(143, Report(124, "node 1 hangs")), 124, None, "exit 124 (not retried)"),
    ("a first hang", Outcome(143, Report(75, "node 1 hangs")), 75, None, "retries it on other nodes"),
    ("a report after success does not undo it", Outcome(0, Report(75, CHILD_LINE)), 0, None, None),
    ("a report wins over this node's hardware", Outcome(1, Report(2, "x"), hardware_fault=XID), 2, None, "exit 2"),
    ("this node's hardware fault", Outcome(1, hardware_fault=XID), 75, f"hardware fault: {XID}", None),
    (
        "stopped with a fault keeps its status",
        Outcome(143, stopped_fault=XID),
        143,
        f"stopped, hardware fault: {XID}",
        None,
    ),
    ("stopped cleanly", Outcome(143), 143, None, None),
]


@pytest.mark.parametrize(("outcome", "code", "mark", "fragment"), [c[1:] for c in AFTER_TRAINING],
                         ids=[c[0] for c in AFTER_TRAINING])  # fmt: skip
def test_the_ending_after_training(outcome, code, mark, fragment):
    result = ending.after_training(outcome)
    assert (result.code, result.mark) == (code, mark)
    if fragment is None:
        assert result.line is None
    else:
        assert fragment in (result.line or "") and (result.line or "").startswith(outcome.report.line)


@pytest.mark.parametrize(
    ("status", "mark"),
    [(75, "preflight: gpus: expected 4, found 3"), (78, None), (2, None)],
    ids=["node fault: taken out", "shared fault: kept", "bad input: kept"],
)
def test_a_failed_preflight_ends_with_its_own_code_and_only_a_node_fault_is_taken_out(status, mark):
    assert ending.preflight_failed(status)
    assert ending.for_preflight(status, "gpus: expected 4, found 3") == Ending(status, mark=mark)


def test_a_preflight_that_could_not_check_is_no_verdict():
    assert not any(ending.preflight_failed(code) for code in (0, 1, 127, 137))
    # Without its line, the marker still says why.
    assert ending.for_preflight(75, "").mark == "preflight: exit 75"


def test_a_stop_before_training_is_143_and_taken_out_only_with_a_recorded_fault():
    assert ending.for_stop_before_training("") == Ending(143)
    assert ending.for_stop_before_training(XID) == Ending(143, mark=f"stopped, hardware fault: {XID}")


@pytest.mark.parametrize(
    ("status", "stopped", "reported", "check"),
    [(0, False, False, False), (1, False, False, True), (1, True, False, False), (1, False, True, False)],
)
def test_only_a_failure_of_this_nodes_own_asks_the_hardware(status, stopped, reported, check):
    assert ending.should_check_hardware(status=status, stopped=stopped, reported=reported) is check


@pytest.mark.parametrize(
    ("status", "is_child", "started", "told", "tells"),
    [(2, True, False, False, True), (0, True, False, False, False), (2, False, False, False, False),
     (1, True, True, False, False), (75, True, False, True, False)],
)  # fmt: skip
def test_a_child_tells_the_main_node_once_and_only_before_training(status, is_child, started, told, tells):
    assert ending.child_tells_main(status=status, is_child=is_child, training_started=started, told=told) is tells
    # A stopped child tells nothing: the main node that would hear it has ended, or is being stopped too.
    assert not ending.child_tells_main(status=143, is_child=True, training_started=False, told=False, stopped=True)


def test_retry_follows_the_exit_code_contract():
    # Retried: only a node fault or a lost node. Every other code ends the job.
    assert retried(ending.NODE_FAULT_EXIT)
    for code in (0, 1, ending.BAD_INPUT_EXIT, ending.IMAGE_EXIT, ending.HANG_EXIT, ending.STOPPED_EXIT, 137):
        assert not retried(code), code
    assert ending.FINAL_CODES == (2, 78, 124)


@pytest.mark.parametrize(
    ("text", "report"),
    [("75 node 1: Batch says FAILED\n", Report(75, "node 1: Batch says FAILED")), ("", None),
     ("124 node 0 hangs\nmore\n", Report(124, "node 0 hangs")), ("x garbled", Report(75, "garbled"))],
)  # fmt: skip
def test_a_report_file_is_its_first_line(text, report):
    assert Report.parse(text) == report


@pytest.mark.parametrize(("returncode", "status"), [(0, 0), (1, 1), (-9, 137), (-15, 143)])
def test_a_signal_counts_as_the_shell_counts_it(returncode, status):
    assert ending.exit_status(returncode) == status


# ------------------------------------------------------------------------------------------- settings
def settings(*args: str, accelerators: int = 4, **env: str) -> node_settings.Settings:
    return read_settings(
        args or ("train.py",), env, accelerators=lambda: accelerators, own_address=lambda: "10.0.0.9",
        which=lambda name: None,
    )  # fmt: skip


def test_a_child_finds_the_main_node_and_counts_its_rank_from_it():
    s = settings(AWS_BATCH_JOB_NUM_NODES="3", AWS_BATCH_JOB_NODE_INDEX="0", AWS_BATCH_JOB_MAIN_NODE_INDEX="2",
                 AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS="10.0.0.7", AWS_BATCH_JOB_ID="abc#0")  # fmt: skip
    assert s.batch is not None and s.batch.report_to == "10.0.0.7" and s.batch.node_rank == 1
    assert s.job_id == s.lineage == "abc" and s.nproc == 4 and s.runner == ("python3", "-m", "torch.distributed.run")
    assert "--rdzv_conf=is_host=0,join_timeout=1800" in s.rendezvous_args()
    assert s.batch.report_port == 29501


def test_the_main_node_hosts_the_rendezvous_on_its_own_address():
    s = settings(AWS_BATCH_JOB_NUM_NODES="2", AWS_BATCH_JOB_NODE_INDEX="1", AWS_BATCH_JOB_MAIN_NODE_INDEX="1")
    assert s.is_main and s.batch is not None and s.batch.address == "10.0.0.9" and s.batch.report_to is None
    assert s.rendezvous_args()[:2] == ["--nnodes=2", "--node_rank=0"]


def test_without_batch_variables_one_node_runs_standalone():
    s = settings(accelerators=1)
    assert s.batch is None and s.rendezvous_args() == ["--standalone", "--nnodes=1", "--nproc_per_node=1"]


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"NPROC_PER_NODE": "0"}, "NPROC_PER_NODE='0'"),
        ({"MASTER_PORT": "70000"}, "MASTER_PORT='70000'"),
        ({"HANG_SECONDS": "1.5"}, "HANG_SECONDS='1.5'"),
        ({"CHECKPOINT_URI": "s3://b/p", "CHECKPOINT_SYNC_MINUTES": "0"}, "CHECKPOINT_SYNC_MINUTES='0'"),
        ({"CHECKPOINT_URI": "s3://b/p", "CHECKPOINT_FINAL_SECONDS": "-1"}, "CHECKPOINT_FINAL_SECONDS='-1'"),
        ({"CHECKPOINT_LINEAGE": "a/../b"}, "CHECKPOINT_LINEAGE=a/../b is not a lineage id"),
        ({"CHECKPOINT_LINEAGE": "my job"}, "CHECKPOINT_LINEAGE=my\\ job is not"),
        ({"AWS_BATCH_JOB_NUM_NODES": "2", "AWS_BATCH_JOB_NODE_INDEX": "2"}, "AWS_BATCH_JOB_NODE_INDEX=2 is not below"),
        ({"AWS_BATCH_JOB_NUM_NODES": "2", "AWS_BATCH_JOB_NODE_INDEX": "1"}, "child node 1 has neither MASTER_ADDR"),
        ({"AWS_BATCH_JOB_NUM_NODES": "2", "AWS_BATCH_JOB_NODE_INDEX": "0", "NODE_REPORT_PORT": "29500"},
         "NODE_REPORT_PORT='29500'"),
        ({"AWS_BATCH_JOB_NUM_NODES": "2", "AWS_BATCH_JOB_NODE_INDEX": "0", "RDZV_JOIN_TIMEOUT": "0"},
         "RDZV_JOIN_TIMEOUT='0'"),
    ],
)  # fmt: skip
def test_a_bad_value_is_named_in_one_line(env, named):
    with pytest.raises(BadInput) as refused:
        settings(**env)
    assert named in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize(
    ("value", "shown"),
    [("a/../b", "a/../b"), ("my job", "my\\ job"), ("x;y", "x\\;y"), ("job42\nnext", "$'job42\\nnext'"), ("", "''")],
)
def test_a_refused_value_is_shown_as_bash_printf_q_shows_it(value, shown):
    assert node_settings.shell_quoted(value) == shown


def test_sync_minutes_are_still_honoured_and_seconds_win():
    assert settings(CHECKPOINT_URI="s3://b", CHECKPOINT_SYNC_MINUTES="1.5").checkpoints.sync_seconds == "90"
    both = settings(CHECKPOINT_URI="s3://b", CHECKPOINT_SYNC_MINUTES="0", CHECKPOINT_SYNC_SECONDS="7")
    assert both.checkpoints.sync_seconds == "7"


def test_an_empty_variable_counts_as_unset():
    s = settings(NPROC_PER_NODE="", MASTER_PORT="", AWS_BATCH_JOB_NUM_NODES="", CHECKPOINT_URI="", PYTHON="")
    assert (s.nproc, s.port, s.batch, s.checkpoints, s.runner[0]) == (4, 29500, None, None, "python3")


def test_the_helpers_interpreters():
    python = node_settings.interpreters({"PYTHON": "/isaac/python.sh"}, which=lambda name: "/usr/bin/python3")
    # Stdlib helpers on the plain python3; boto3's on the trainer's interpreter.
    assert (python.stdlib, python.preflight) == ("/usr/bin/python3", "/usr/bin/python3")
    assert python.checkpoint == python.node_watch == python.cold_start == "/isaac/python.sh"
    alone = node_settings.interpreters({"PYTHON": "/isaac/python.sh"}, which=lambda name: None)
    assert alone.preflight == alone.stdlib == "/isaac/python.sh"


# ------------------------------------------------------------------------------------------- resume
def test_resume_arguments_name_the_newest_matching_folder(tmp_path: Path):
    for folder, stamp in (("run-a", 100), ("run-b", 200)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "model_1.pt").write_text("w")
        import os

        os.utime(tmp_path / folder / "model_1.pt", (stamp, stamp))
    (tmp_path / "run-c").mkdir()
    (tmp_path / "run-c" / "params.yaml").write_text("only configuration")
    args = restore_phase.resume_arguments("--resume --load_run {resume_dir}", "model_*.pt", tmp_path)
    assert args == ("--resume", "--load_run", "run-b")
    assert restore_phase.resume_arguments("--resume", "nothing_*.pt", tmp_path) == ()
    assert restore_phase.resume_arguments("--resume  --x", "", tmp_path) == ("--resume", "--x")
    with pytest.raises(BadInput, match="RESUME_GLOB='a/b' is a file-name pattern"):
        restore_phase.resume_arguments("--resume", "a/b", tmp_path)


def test_the_exit_code_table_in_the_docs_is_the_launchers():
    text = (ROOT / "docs" / "health.md").read_text()
    section = text.split("## How a node's attempt ends: the launcher's exit codes", 1)[1].split("\n## ", 1)[0]
    rows = [line.split(" | ") for line in section.splitlines() if line.startswith("| ") and "---" not in line][1:]
    codes = {row[0].strip("| ").split()[0]: row[2].startswith("yes") for row in rows}
    expected = (0, 1, ending.BAD_INPUT_EXIT, ending.NODE_FAULT_EXIT, ending.IMAGE_EXIT, ending.HANG_EXIT)
    assert set(codes) == {str(code) for code in (*expected, ending.STOPPED_EXIT)}
    # The column says what the job definitions' retry strategy does.
    assert all(codes[str(code)] is retried(code) for code in (*expected, ending.STOPPED_EXIT))


# ------------------------------------------------------------------------------------------- the package
LAUNCHER_DIR = ROOT / "container" / "launcher"
SIBLINGS = {p.stem for p in LAUNCHER_DIR.glob("*.py")}


def imports(name: str) -> set[str]:
    import ast

    tree = ast.parse((LAUNCHER_DIR / f"{name}.py").read_text(), feature_version=(3, 10))
    found = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    found |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    return found


def test_every_module_is_python_3_10_and_needs_only_stdlib_and_boto3():
    # The images' oldest interpreter is 3.10; boto3 only for what talks to AWS (the copier, the node watch,
    # the hang evidence, the workdir fetch), which run on the trainer's interpreter.
    allowed = set(sys.stdlib_module_names) | {"__future__"} | SIBLINGS
    # step_timing.py runs inside the training processes, and reaches torch only once the script imported it.
    inside_training = {"step_timing": {"torch"}}
    for name in SIBLINGS:
        assert imports(name) <= allowed | {"boto3", "botocore"} | inside_training.get(name, set()), name


def test_the_launcher_process_itself_is_stdlib_only():
    # It runs on a plain python3 that may lack boto3: what __main__ reaches through its siblings.
    seen, todo = set(), ["__main__"]
    while todo:
        name = todo.pop()
        seen.add(name)
        found = imports(name)
        assert found <= set(sys.stdlib_module_names) | {"__future__"} | SIBLINGS, (name, found - SIBLINGS)
        todo += [s for s in found & SIBLINGS if s not in seen]
    assert {"run_node", "ending", "node_settings", "stop_signals", "watchers", "trainer"} <= seen
    assert not seen & {"checkpoint_sync", "node_watch", "progress_watch", "hang_evidence", "workdir_fetch"}


def test_the_start_time_and_the_signal_handlers_come_before_the_launchers_imports():
    # As the container's first process, a SIGTERM that comes while Python imports would be dropped; the
    # start time is what the Xid judge, the node watch and the cold-start line count from.
    import ast

    body = ast.parse((LAUNCHER_DIR / "__main__.py").read_text()).body
    docstring = isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
    statements = [ast.unparse(node) for node in body[1 if docstring else 0 :]]
    order = [next(i for i, text in enumerate(statements) if key in text) for key in
             ("started = time.time()", "signals.install()", "from run_node import main")]  # fmt: skip
    assert order == sorted(order)
    assert all(text.startswith("import ") for text in statements[: order[0]])
