"""The faults a rehearsal was asked for, acted out when their triggers come (faults.py parses them): on a
node's container, on its host, on the local S3, or on the job's next retry."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
import time
from collections.abc import Callable

from config.job_events import TRAINCTL_CANCEL_REASON
from trainctl.rehearsal import batch_rules
from trainctl.rehearsal.definition import JobSpec
from trainctl.rehearsal.faults import TERMINATING, Fault, fault_node
from trainctl.rehearsal.hosts import Host
from trainctl.rehearsal.local_s3 import LocalS3
from trainctl.rehearsal.nodes import NodeRun
from trainctl.rehearsal.records import Attempt, JobRun, Lag

# (the attempt, or None for the job's own timeline; the text)
Event = Callable[[Attempt | None, str], None]
# Faults that act on the running attempt, whatever their trigger (see on_progress).
ON_RUNNING = ("kill-child", "kill-main", "stop-rank", "stall-rank", "lose-host", "kill-upload", "never-start",
              "slow-node", *TERMINATING)  # fmt: skip
# slow-node: the ranks are stopped for a share of every period.
SLOW_PERIOD_SECONDS = 0.1


class FaultPlayer:
    def __init__(
        self,
        faults: list[Fault],
        *,
        s3: LocalS3,
        event: Event,
        budget_reason: Callable[[], str] = lambda: "trainctl budget:",
    ) -> None:
        self.pending = list(faults)
        self.s3 = s3
        self._event = event
        self._budget_reason = budget_reason
        self.capacity_cancel_armed = False
        # batch-lag: (since, seconds), read by DescribeJobs' answers on the local endpoint's thread.
        self.lag: Lag | None = None
        # TerminateJob's reason once a cancel or a budget stop fired; the engine stops the job.
        self.terminate_reason = ""

    def never_starts(self, number: int, runs: list[NodeRun], spec: JobSpec, attempt: Attempt) -> None:
        """The nodes whose image cannot be pulled in attempt `number`: their containers never run."""
        for fault in [f for f in self.pending if f.kind == "never-start" and int(f.at) == number]:
            self.pending.remove(fault)
            run = runs[fault_node(fault, nodes=spec.nodes, main=spec.main_node) or 0]
            run.reason = batch_rules.CANNOT_PULL_REASON
            self._event(attempt, f"fault {fault.spec}: node {run.index}'s image cannot be pulled")

    def at_attempt(self, number: int, hosts: list[Host], spec: JobSpec) -> None:
        """Faults that act before an attempt's nodes start: on hosts (warm ones are reused) or on S3."""
        for fault in list(self.pending):
            if fault.trigger not in ("start", "attempt") or int(fault.at) != number:
                continue
            node = fault_node(fault, nodes=spec.nodes, main=spec.main_node)
            if fault.kind in ON_RUNNING:
                continue  # they act on the running attempt (see on_progress)
            self.pending.remove(fault)
            self._apply_host_fault(fault, hosts[node] if node is not None else None, node)

    def _apply_host_fault(self, fault: Fault, host: Host | None, node: int | None) -> None:
        if fault.kind == "preflight-fail" and host is not None:
            lost = host.lose_device()
            self._event(None, f"fault {fault.spec}: {host.describe()} of node {node} lost {lost}")
        elif fault.kind == "neuron-tool-fail" and host is not None:
            host.break_neuron_tool()
            self._event(None, f"fault {fault.spec}: {host.describe()}'s neuron-ls fails, its devices present")
        elif fault.kind == "slow-preflight" and host is not None:
            host.slow_tools(fault.value or 0)
            self._event(None, f"fault {fault.spec}: {host.describe()}'s device tools answer after {fault.value:g} s")
        elif fault.kind == "xid" and host is not None:
            host.record_xid(time.time(), int(fault.value or 79))
            self._event(
                None, f"fault {fault.spec}: {host.describe()} of node {node} recorded Xid {int(fault.value or 79)}"
            )
        elif fault.kind == "s3-slowdown":
            self.s3.slow_down(fault.value or 0)
            self._event(None, f"fault {fault.spec}: the local S3 answers 503 SlowDown for {fault.value:g} s")
        elif fault.kind == "batch-lag":
            self.lag = (time.monotonic(), fault.value or 0.0)
            self._event(None, f"fault {fault.spec}: DescribeJobs shows a node's end {fault.value:g} s late from now on")
        elif fault.kind == "capacity-cancel":
            self.capacity_cancel_armed = True
            self._event(None, f"fault {fault.spec}: the job's next retry will find no capacity")

    def _due(self, fault: Fault, attempt: Attempt, job: JobRun, now: float, job_start: float) -> bool:
        if fault.trigger in ("start", "attempt"):
            return attempt.number == int(fault.at)
        if fault.trigger == "seconds":
            return now - job_start >= fault.at
        return len(job.checkpoint_seen) >= fault.at

    def on_progress(self, attempt: Attempt, job: JobRun, now: float, job_start: float) -> None:
        """Faults whose trigger came while the attempt runs: on its nodes, their hosts or S3."""
        spec = job.spec
        for fault in list(self.pending):
            if not self._due(fault, attempt, job, now, job_start):
                continue
            node = fault_node(fault, nodes=spec.nodes, main=spec.main_node)
            run = attempt.nodes[node] if node is not None else None
            if run is not None and not run.running:
                continue  # wait until the node runs
            if fault.kind in ("stop-rank", "slow-node") and run is not None and not run.ranks():
                continue  # wait until torchrun has started the ranks
            self.pending.remove(fault)
            if fault.kind in ("kill-child", "kill-main") and run is not None:
                self._event(attempt, f"fault {fault.spec}: SIGKILL node {node}'s container")
                run.kill_group()
            elif fault.kind == "lose-host" and run is not None:
                run.host.powered_off = True
                run.power_off(batch_rules.HOST_LOST_REASON.format(instance=run.host.instance_id))
                self._event(attempt, f"fault {fault.spec}: {run.host.describe()} of node {node} terminated")
            elif fault.kind == "stop-rank" and run is not None:
                ranks = run.ranks()
                for pid in ranks:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGSTOP)
                self._event(attempt, f"fault {fault.spec}: SIGSTOP node {node}'s ranks (pids {ranks})")
            elif fault.kind == "slow-node" and run is not None:
                share = fault.value or 0.5
                threading.Thread(target=slow_down, args=(run, share), daemon=True).start()
                self._event(attempt, f"fault {fault.spec}: node {node}'s ranks stopped {share:.0%} of every "
                            f"{SLOW_PERIOD_SECONDS * 1000:.0f} ms (pids {run.ranks()})")  # fmt: skip
            elif fault.kind == "stall-rank" and run is not None:
                # The first rank of the node (LOCAL_RANK 0) sleeps at its next step: the script reads the file.
                run.stall_file.write_text("0\n")
                self._event(attempt, f"fault {fault.spec}: node {node}'s local rank 0 sleeps in its own code")
            elif fault.kind in TERMINATING:
                # API TerminateJob: the reason "is returned by future DescribeJobs operations on the job".
                self.terminate_reason = TRAINCTL_CANCEL_REASON if fault.kind == "cancel" else self._budget_reason()
                self._event(attempt, f"fault {fault.spec}: TerminateJob ({self.terminate_reason})")
            elif fault.kind == "kill-upload":
                self._arm_upload_loss(fault, attempt)
            else:
                self._apply_host_fault(fault, run.host if run is not None else None, node)

    def _arm_upload_loss(self, fault: Fault, attempt: Attempt) -> None:
        """The next checkpoint file a node of this attempt sends: its host is lost while the upload runs."""

        fired = threading.Lock()  # uploads come in on several server threads: one of them acts

        def hook(method: str, bucket: str, key: str) -> bool:
            match = re.search(r"/node-(\d+)/", "/" + key)
            if match is None or int(match.group(1)) >= len(attempt.nodes):
                return False
            run = attempt.nodes[int(match.group(1))]
            if not run.running or not fired.acquire(blocking=False):
                return False
            self.s3.hooks.remove(hook)
            run.host.powered_off = True
            run.power_off(batch_rules.HOST_LOST_REASON.format(instance=run.host.instance_id))
            self._event(attempt, f"fault {fault.spec}: {run.host.describe()} of node {run.index} lost while "
                        f"uploading {key.rsplit('/', 1)[-1]}")  # fmt: skip
            return True

        self.s3.hooks.append(hook)
        self._event(attempt, f"{fault.spec} armed: the next checkpoint upload loses its host")


def slow_down(run: NodeRun, share: float, period: float = SLOW_PERIOD_SECONDS) -> None:
    """Stop `run`'s training ranks for `share` of every `period` while its container runs (the ranks are
    looked up again every second: a restarted rank is slowed too); they are left running at the end."""
    ranks: list[int] = []
    looked = 0.0
    try:
        while run.running:
            if time.monotonic() - looked >= 1.0:
                ranks, looked = run.ranks(), time.monotonic()
            _signal(ranks, signal.SIGSTOP)
            time.sleep(period * share)
            _signal(ranks, signal.SIGCONT)
            time.sleep(period * (1 - share))
    finally:
        _signal(ranks, signal.SIGCONT)


def _signal(pids: list[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)
