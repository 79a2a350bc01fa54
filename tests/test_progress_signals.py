"""What counts as a node's progress (container/launcher/progress_signals.py): /proc's numbers parsed from
hand-written text, the thresholds on made-up counters, and the signals read from real short-lived processes
standing in for a rank: what the processes a rank starts burn counts, the rank's own spinning does not; its
disk writes count, its socket traffic does not."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "container" / "launcher"))
import progress_signals as signals  # noqa: E402

TICKS = signals.TICKS


def stat_line(
    pid: int, ppid: int, state: str = "S", cpu: tuple[int, int] = (0, 0), waited: tuple[int, int] = (0, 0)
) -> str:
    # proc(5): fields 3.. after "(comm)"; utime, stime, cutime, cstime are 14-17 and starttime 22.
    rest = [state, ppid, 1, 1, 0, -1, 0, 0, 0, 0, 0, *cpu, *waited, 20, 0, 4, 0, 1234, 0]
    return f"{pid} (py thon) (x)) " + " ".join(map(str, rest))


def table(*rows: signals.Process) -> dict[int, signals.Process]:
    return {row.pid: row for row in rows}


def test_stat_is_read_after_the_last_parenthesis_of_the_command_name():
    process = signals.parse_stat(42, stat_line(42, 7, "T", cpu=(150, 50), waited=(30, 20)))
    assert process == signals.Process(pid=42, ppid=7, state="T", start=1234, cpu=200, waited=50)


def test_the_helpers_cpu_is_what_the_ranks_started_never_the_ranks_own():
    processes = table(
        signals.Process(10, 1, "S", 0, cpu=5 * TICKS, waited=0),  # torchrun
        signals.Process(11, 10, "R", 0, cpu=900 * TICKS, waited=3 * TICKS),  # a rank spinning; reaped a compiler
        signals.Process(12, 11, "R", 0, cpu=2 * TICKS, waited=TICKS),  # its data-loader worker
        signals.Process(13, 12, "S", 0, cpu=TICKS, waited=0),  # and what that started
        signals.Process(20, 10, "R", 0, cpu=800 * TICKS, waited=0),  # another rank, on its own
    )
    assert signals.helpers_cpu_seconds(processes, [11, 20]) == 3 + 2 + 1 + 1
    assert signals.helpers_cpu_seconds(processes, []) == 0
    ranks = {11: "0", 12: "0", 13: "0", 20: "1"}  # the worker and its child inherit RANK
    assert signals.rank_pids(processes, 10, ranks.get) == [11, 20]
    assert signals.tree(processes, [11]) == {11, 12, 13}


def test_disk_io_is_read_bytes_plus_write_bytes_and_never_rchar_or_wchar():
    text = "rchar: 900000\nwchar: 800000\nsyscr: 10\nsyscw: 20\nread_bytes: 4096\nwrite_bytes: 8192\n"
    text += "cancelled_write_bytes: 0\n"
    assert signals.parse_io(text) == 4096 + 8192


def test_a_counter_moves_only_by_a_step_within_the_window():
    meter = signals.Meter(step=1.0, window=20.0)
    assert not meter.moved(0.0, 0.0)  # the first reading is the base
    # Bookkeeping: 10 ms a second for a minute never adds up to a step within 20 s.
    assert not any(meter.moved(0.01 * t, float(t)) for t in range(1, 61))
    assert meter.moved(0.6 + 1.0, 61.0)  # a compiler's second of CPU
    assert not meter.moved(0.2, 62.0)  # a process ended and its count left the sum: a new base
    assert meter.moved(1.2, 63.0)


def test_the_checkpoint_scan_sees_a_change_and_reads_no_more_than_its_limit(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    for index in range(5):
        (tmp_path / "a" / "b" / f"shard-{index}").write_bytes(b"x" * 10)
    files, size, newest = signals.scan(tmp_path)
    assert (files, size) == (5, 50) and newest > 0
    assert signals.scan(tmp_path, limit=4)[0] < 5
    shard = tmp_path / "a" / "b" / "shard-0"
    shard.write_bytes(b"y" * 10)  # written in place, same size: the mtime says so
    os.utime(shard, ns=(newest + 10**9, newest + 10**9))
    assert signals.scan(tmp_path) == (5, 50, newest + 10**9)
    assert signals.scan(tmp_path / "missing") == (0, 0, 0)


def fake_process(proc: Path, pid: int, ppid: int, env: str, cpu: int = 0, io: int = 0) -> None:
    folder = proc / str(pid)
    folder.mkdir(exist_ok=True)
    (folder / "stat").write_text(stat_line(pid, ppid, cpu=(cpu, 0)))
    (folder / "environ").write_bytes(env.encode() + b"\0PATH=/usr/bin\0")
    (folder / "io").write_text(f"rchar: 0\nwchar: {10 * io}\nread_bytes: 0\nwrite_bytes: {io}\n")


def test_a_rank_seen_between_fork_and_exec_is_still_found_once_it_has_its_rank(tmp_path):
    """torchrun's child has torchrun's environment (no RANK) until it execs the script: a sample in between
    must not make the watch take the rank's workers for ranks (their own CPU would not count) for good."""
    proc = tmp_path / "proc"
    proc.mkdir()
    fake_process(proc, 10, 1, "HOME=/root")  # torchrun
    fake_process(proc, 11, 10, "HOME=/root")  # forked, not yet exec'd
    watch = signals.Signals(10, proc=proc)
    assert watch.sample(0.0) == []
    fake_process(proc, 11, 10, "RANK=0")
    fake_process(proc, 12, 11, "RANK=0")  # its data-loader worker
    assert watch.sample(1.0) == []
    fake_process(proc, 12, 11, "RANK=0", cpu=2 * TICKS, io=2 << 20)
    assert watch.sample(2.0) == [signals.HELPERS, signals.DISK]
    fake_process(proc, 11, 10, "RANK=0", cpu=50 * TICKS)  # the rank's own CPU: nothing
    assert watch.sample(3.0) == []


def test_a_file_changing_in_the_checkpoint_folder_is_progress_whoever_writes_it(tmp_path):
    proc, checkpoints = tmp_path / "proc", tmp_path / "checkpoints"
    proc.mkdir()
    checkpoints.mkdir()
    (checkpoints / "restored.pt").write_bytes(b"x")  # what the restore brought back: the first look's base
    watch = signals.Signals(10, checkpoints, proc=proc)
    assert watch.sample(0.0) == []
    (checkpoints / "step-100").mkdir()
    (checkpoints / "step-100" / "shard-0.pt").write_bytes(b"y" * 100)
    assert watch.sample(1.0) == [signals.CHECKPOINTS]
    assert watch.sample(2.0) == []
    (checkpoints / "restored.pt").unlink()  # a rotation deleting the oldest: a change too
    assert watch.sample(3.0) == [signals.CHECKPOINTS]


class Moves:
    """A stand-in for Signals: the names given for each sample."""

    def __init__(self, *names: str) -> None:
        self.names = list(names)

    def sample(self, now: float) -> list[str]:
        return [self.names.pop(0)] if self.names else []


def test_a_silent_phase_with_a_moving_signal_is_progress_and_the_silence_after_it_is_not(tmp_path):
    output = tmp_path / "output"
    output.touch()
    os.utime(output, (1000, 1000))
    progress = signals.Progress(5, tmp_path / "heartbeat", output, Moves(*[signals.HELPERS] * 10))  # type: ignore[arg-type]
    for now in range(1000, 1040, 4):  # 40 s without output: a compiler burns CPU for 40 s
        progress.sample(float(now))
        assert progress.state(now) == signals.PROGRESSING
    assert progress.source == signals.HELPERS and progress.last == 1036 and progress.limit == 8
    progress.sample(1044.0)
    assert progress.state(1044.0) == signals.HUNG


def test_the_other_signals_do_not_start_the_watch_on_a_trainer_that_never_printed(tmp_path):
    progress = signals.Progress(5, tmp_path / "heartbeat", tmp_path / "output", Moves(signals.DISK))  # type: ignore[arg-type]
    progress.sample(1000.0)
    assert progress.last is None and progress.state(10**10) == signals.PROGRESSING


# --- real processes -----------------------------------------------------------------------------------

RANK = """
import os, socket, subprocess, sys, time
from pathlib import Path
what = sys.argv[1]
if what == "helper":  # a compiler: a child process that burns CPU
    subprocess.run([sys.executable, "-c", "import time\\nwhile time.process_time() < 2.5: pass"], check=True)
elif what == "spin":  # the rank itself spins, as one waiting in an NCCL collective does
    while time.process_time() < 2.5:
        pass
elif what == "save":
    with open(sys.argv[2], "wb") as out:
        for _ in range(8):
            out.write(os.urandom(1 << 20))
            out.flush()
            time.sleep(0.05)
elif what == "socket":  # a collective's traffic over a socket
    left, right = socket.socketpair()
    for _ in range(64):
        left.sendall(b"x" * 65536)
        right.recv(65536, socket.MSG_WAITALL)
    sys.stdout.buffer.write(b"y" * (8 << 20))  # and output through a pipe
time.sleep(0.6)  # a sample or two after the work, and after the helper was reaped
"""


def moved_while(tmp_path: Path, *args: str) -> set[str]:
    """The signals that moved while a process standing in for a rank (RANK set) ran `RANK` with `args`."""
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    env = {k: v for k, v in os.environ.items() if k != "RANK"} | {"RANK": "0"}
    rank = subprocess.Popen([sys.executable, str(script), *args], env=env, stdout=subprocess.PIPE)
    assert rank.stdout is not None
    drain = threading.Thread(target=rank.stdout.read, daemon=True)
    drain.start()
    watch = signals.Signals(rank.pid)
    moved: set[str] = set()
    try:
        while rank.poll() is None:
            moved |= set(watch.sample(time.time()))
            time.sleep(0.1)
    finally:
        rank.kill()
        rank.wait()
    assert rank.returncode == 0
    return moved


def test_the_cpu_of_a_process_a_rank_started_counts_and_the_ranks_own_does_not(tmp_path):
    assert signals.HELPERS in moved_while(tmp_path, "helper")
    assert signals.HELPERS not in moved_while(tmp_path, "spin")


def test_a_ranks_disk_writes_count_and_its_socket_and_pipe_traffic_do_not(tmp_path):
    assert signals.DISK in moved_while(tmp_path, "save", str(tmp_path / "checkpoint.pt"))
    assert moved_while(tmp_path, "socket") == set()
