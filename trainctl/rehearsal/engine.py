"""A multi-node job's attempts under Batch's rules (batch_rules.py), on simulated hosts (hosts.py), with
the faults asked for (faults.py). The process runtime: each node's container is a set of processes on this
machine (nodes.py) running this checkout's launcher; the faults act through fault_player.py."""

from __future__ import annotations

import random
import time
import uuid
from pathlib import Path
from typing import Any

from trainctl.rehearsal import app_code, batch_rules
from trainctl.rehearsal.definition import JobSpec
from trainctl.rehearsal.fault_player import FaultPlayer
from trainctl.rehearsal.faults import Fault
from trainctl.rehearsal.fleet_facts import FleetFacts, deployed_facts
from trainctl.rehearsal.hosts import TAKE_OUT_GRACE_SECONDS, HostPool
from trainctl.rehearsal.local_s3 import LocalS3
from trainctl.rehearsal.nodes import NodeRun, containers_with_ranks, wait_gone
from trainctl.rehearsal.progress import Narrator
from trainctl.rehearsal.records import Attempt, JobRun, Rehearsal, node_job
from trainctl.rehearsal.runtime import Runtime

TICK_SECONDS = 0.1
CHECKPOINT_POLL_SECONDS = 0.5


class Engine:
    def __init__(
        self,
        *,
        runtime: Runtime,
        s3: LocalS3,
        faults: list[Fault],
        root: Path,
        deadline_seconds: float,
        seed: int,
        child_delay_seconds: float = 1.0,
        facts: FleetFacts | None = None,
        describe_merged: bool = False,
        narrator: Narrator | None = None,
    ) -> None:
        self.runtime = runtime
        self.s3 = s3
        self.faults = list(faults)
        self.root = root
        self.deadline_seconds = deadline_seconds
        self.random = random.Random(seed)  # noqa: S311 - a reproducible start order, not a secret
        self.child_delay_seconds = child_delay_seconds
        self.facts = facts or deployed_facts()
        self.describe_merged = describe_merged
        self.narrator = narrator or Narrator()
        self._joined: set[int] = set()  # the nodes of this attempt whose training processes started
        self.player = FaultPlayer(
            faults, s3=s3, event=self._event, budget_reason=lambda: app_code.budget_stop_reason(runtime.checkout)
        )
        self.job_start = 0.0
        self.live: list[NodeRun] = []
        s3.describe = self.describe

    # -- the job ------------------------------------------------------------------------------------------
    def rehearse(self, spec: JobSpec) -> Rehearsal:
        first = JobRun(job_id=str(uuid.uuid4()), spec=spec, placement=0)
        result = Rehearsal(first=first, faults=self.faults, started=time.monotonic(), facts=self.facts)
        self.result = result
        self.narrator.started = result.started
        self.deadline = result.started + self.deadline_seconds
        try:
            job: JobRun | None = first
            while job is not None:
                pool = HostPool(self.root / f"placement-{job.placement}", self.runtime.devices(job.spec))
                result.pools.append(pool)
                job = self._run_job(job, pool)
        finally:
            wait_gone(self.live)
            result.ended = time.monotonic()
            result.unfired = [fault.spec for fault in self.player.pending]
            result.throttled = self.s3.throttled
        return result

    def _run_job(self, job: JobRun, pool: HostPool) -> JobRun | None:
        """Every attempt of one job; the successor the capacity fallback submitted, if any."""
        number = 0
        while True:
            number += 1
            if number > 1 and self.player.capacity_cancel_armed:
                # The retry went back to RUNNABLE and found no capacity: the queue's time limit cancels it
                # (API JobStateTimeLimitAction; Batch user guide, "Jobs stuck in RUNNABLE"), and the fallback
                # resubmits it. Nothing runs while a job waits RUNNABLE, so the wait is recorded, not slept.
                self.player.capacity_cancel_armed = False
                job.status, job.status_reason = "FAILED", batch_rules.CAPACITY_CANCEL_REASON
                job.runnable_wait = self.facts.capacity_wait_seconds or 0.0
                job.cancelled_at = cancelled = time.monotonic()
                self._event(
                    None,
                    f"job {job.job_id}: retry {number} waits RUNNABLE without capacity for the queue's "
                    f"{job.runnable_wait:.0f} s ({self.facts.capacity_wait_from}; not slept here); "
                    f"{job.status_reason}",
                )
                self.narrator.job_note(
                    cancelled,
                    f"retry {number} finds no capacity: the queue cancels the job after its "
                    f"{job.runnable_wait:.0f} s wait (not slept here)",
                )
                return self._resubmit(job)
            attempt = self._run_attempt(job, pool, number)
            job.attempts.append(attempt)
            main = attempt.main
            attempt.exit_code, attempt.reason, attempt.status_reason = main.exit_code, main.reason, main.status_reason
            retried = self._decide(job, attempt, number)
            now = attempt.ended or time.monotonic()
            self.narrator.attempt_ended(now, number, main.exit_code, main.started is not None, bool(main.lost),
                                        attempt.retry)  # fmt: skip
            if not retried:
                self.narrator.job_ended(now, job.job_id, job.status, job.status_reason, len(job.attempts))
                return None

    def _decide(self, job: JobRun, attempt: Attempt, number: int) -> bool:
        """Whether Batch retries the job after `attempt`; if not, the job's status and reason."""
        main = attempt.main
        if self.result.deadline_hit:
            job.status, job.status_reason = "FAILED", "rehearsal deadline: the job had not ended"
            return False
        if job.terminated:
            # Batch user guide, "Automated job retries": a cancelled or terminated job is not retried;
            # API TerminateJob: its reason "is returned by future DescribeJobs operations on the job".
            attempt.retry = "not retried: TerminateJob ends a job for good"
            job.status, job.status_reason = "FAILED", job.terminated
            return False
        if attempt.status_reason == batch_rules.TIMEOUT_REASON:
            attempt.retry = "not retried: a job that timed out is never retried"
            job.status, job.status_reason = "FAILED", attempt.status_reason
            return False
        if main.exit_code == 0:
            job.status, job.status_reason = "SUCCEEDED", attempt.status_reason
            return False
        retry, why = batch_rules.retry_decision(
            job.spec.retry_rules, exit_code=main.exit_code, reason=main.reason, status_reason=main.status_reason
        )
        if retry and number < job.spec.attempts:
            attempt.retry = f"retried: {why}"
            return True
        attempt.retry = (
            f"not retried: {why}" if not retry else f"not retried: attempts exhausted ({number} of {job.spec.attempts})"
        )
        job.status, job.status_reason = "FAILED", attempt.status_reason
        return False

    def _resubmit(self, job: JobRun) -> JobRun:
        request = app_code.resubmission(self.runtime.checkout, job, merged=self.describe_merged)
        spec = self.runtime.prepare(app_code.spec_from_request(job.spec, request))
        successor = JobRun(
            job_id=str(uuid.uuid4()), spec=spec, placement=job.placement + 1, resubmitted_from=job.job_id
        )
        # One lineage (CHECKPOINT_LINEAGE): the checkpoints already in S3 are the predecessor's, not new ones.
        successor.checkpoint_seen = dict(job.checkpoint_seen)
        successor.checkpoint_saves = {name: list(saves) for name, saves in job.checkpoint_saves.items()}
        job.successor = successor
        self._event(
            None, f"capacity fallback: resubmitted as job {successor.job_id} to placement {successor.placement}"
        )
        self.narrator.job_note(time.monotonic(), f"the capacity fallback resubmits it as job {successor.job_id}")
        return successor

    # -- one attempt ---------------------------------------------------------------------------------------
    def _run_attempt(self, job: JobRun, pool: HostPool, number: int) -> Attempt:
        spec = job.spec
        now = time.monotonic()
        if not self.job_start:
            self.job_start = now
        hosts = pool.place(spec.nodes)
        self.player.at_attempt(number, hosts, spec)
        folder = self.root / job.job_id / f"attempt-{number}"
        runs = [
            NodeRun(
                index=i,
                host=hosts[i],
                folder=folder / f"node-{i}",
                log_path=folder / f"node-{i}.log",
                is_main=i == spec.main_node,
            )
            for i in range(spec.nodes)
        ]
        attempt = Attempt(number=number, started=now, nodes=runs)
        self.attempt, self.job = attempt, job
        self._joined = set()
        self.narrator.attempt_started(now, job.job_id, number, spec.attempts)
        self.player.never_starts(number, runs, spec, attempt)
        for host in hosts:
            self._event(attempt, f"{host.describe()} serves node {hosts.index(host)}")
        self._start(attempt, attempt.main, now)
        # Batch user guide, "Multi-node parallel jobs": the children are launched once the main node's
        # container runs, in random order with no guaranteed timing.
        children = [r for r in runs if not r.is_main]
        self.random.shuffle(children)
        due = {r.index: now + self.random.uniform(0, self.child_delay_seconds) for r in children}
        last_poll = 0.0
        while True:
            now = time.monotonic()
            for run in children:
                if run.process is None and run.ended is None and now >= due[run.index] and attempt.main.running:
                    self._start(attempt, run, now)
            for run in runs:
                if run.poll(now, batch_rules.EXITED_REASON):
                    ending = "lost its host (no exit code)" if run.exit_code is None else f"exited {run.exit_code}"
                    self._event(attempt, f"node {run.index} {ending}")
                    self.narrator.node_ended(now, run.index, run.exit_code, bool(run.lost))
            self._hosts(attempt, now)
            if now - last_poll >= CHECKPOINT_POLL_SECONDS:
                last_poll = now
                self._checkpoints(job, now)
                self._rendezvous(runs, now)
                self.player.on_progress(attempt, job, now, self.job_start)
            main = attempt.main
            if now >= self.deadline:
                # The rehearsal's own stop, not Batch's: ECS's default grace, whatever the fleet's.
                self.result.deadline_hit = True
                why = f"rehearsal deadline ({self.deadline_seconds:.0f} s)"
                self._end_children(attempt, why, now, main_too=True, grace=batch_rules.STOP_GRACE_SECONDS)
            elif main.ended is not None:
                self._end_children(attempt, "the main node ended: Batch stops the other nodes", now)
            elif self.player.terminate_reason:
                if not job.terminated:
                    job.terminated = main.status_reason = self.player.terminate_reason
                self._end_children(attempt, f"TerminateJob ({job.terminated})", now, main_too=True)
            elif spec.timeout_seconds and now - attempt.started >= spec.timeout_seconds:
                main.status_reason = batch_rules.TIMEOUT_REASON
                self._end_children(attempt, f"attempt timed out after {spec.timeout_seconds} s", now, main_too=True)
            if all(r.ended is not None for r in runs):
                break
            time.sleep(TICK_SECONDS)
        attempt.ended = time.monotonic()
        attempt.checkpoints_at_end = self.runtime.checkpoints(job)
        # A file that landed after the last poll (the final upload, just before the main node exited).
        for name in attempt.checkpoints_at_end:
            job.checkpoint_seen.setdefault(name, attempt.ended)
        self.narrator.checkpoints(attempt.ended, self._new_first(job))
        job.evidence = self.runtime.evidence(job)
        return attempt

    def _checkpoints(self, job: JobRun, now: float) -> None:
        for name in self.runtime.checkpoints(job):
            job.checkpoint_seen.setdefault(name, now)
        self.narrator.checkpoints(now, self._new_first(job))

    @staticmethod
    def _new_first(job: JobRun) -> list[str]:
        """The lineage's checkpoint files in the order they were seen (the narrator tells the new ones)."""
        return sorted(job.checkpoint_seen, key=lambda name: (job.checkpoint_seen[name], len(name), name))

    def _rendezvous(self, runs: list[NodeRun], now: float) -> None:
        """torchrun starts a node's training processes only once every node joined the rendezvous: the
        rendezvous is complete when every node of the attempt has them (as container/launcher/cold_start.py
        measures it on Batch). Nodes seen with them are not looked at again."""
        if len(self._joined) == len(runs) or not all(r.running for r in runs):
            return
        waiting = {run.token: run.index for run in runs if run.index not in self._joined}
        self._joined.update(waiting[token] for token in containers_with_ranks(set(waiting)))
        if len(self._joined) == len(runs):
            self.narrator.rendezvous(now, len(runs))

    def _start(self, attempt: Attempt, run: NodeRun, now: float) -> None:
        if run.ended is not None:
            return
        if run.reason:  # never-start set it
            run.never_started(now, run.reason, batch_rules.FAILED_TO_START_REASON)
            self._event(attempt, f"node {run.index}: container never started ({run.reason})")
            self.narrator.node_never_started(now, run.index, run.reason)
            return
        command, env = self.runtime.node_command(self.job, attempt.number, run, attempt.main.host.address)
        self.live.append(run)  # first: a Ctrl-C while it starts still stops it
        run.start(command, env, now)
        self._event(attempt, f"node {run.index} started on {run.host.describe()}")
        self.narrator.node_started(now, run.index, run.is_main, run.host.describe())

    def _end_children(
        self, attempt: Attempt, why: str, now: float, *, main_too: bool = False, grace: float | None = None
    ) -> None:
        """docker stop for every node still running: the stop signal, SIGKILL after the fleet's stop timeout
        (ECS_CONTAINER_STOP_TIMEOUT, fleet_facts.py); a node not started yet never starts."""
        grace = self.facts.stop_grace_seconds if grace is None else grace
        stopped, killed = [], []
        for run in attempt.nodes:
            if run.ended is not None or (run.is_main and not main_too):
                continue
            if run.process is None:
                run.never_started(now, "", "the job ended before this node started")
                continue
            if run.stop_sent is None:
                self._event(attempt, f"node {run.index}: SIGTERM ({why})")
                run.stop(now)
                stopped.append(run.index)
            elif run.overdue(now, grace):
                self._event(attempt, f"node {run.index}: SIGKILL after {grace:.0f} s")
                run.kill_group()
                killed.append(run.index)
        self.narrator.stopping(now, "SIGTERM", stopped, why)
        self.narrator.stopping(now, "SIGKILL", killed, f"still running {grace:.0f} s after SIGTERM")

    def _hosts(self, attempt: Attempt, now: float) -> None:
        """The host side of a take-out: the marker is seen, and the host powers off after its grace."""
        for run in attempt.nodes:
            host = run.host
            if host.taken_out_at is None:
                marker = host.take_out_marker()
                if marker is not None:
                    host.taken_out_at, host.take_out_reason = now, marker
                    self._event(
                        attempt,
                        f"{host.describe()}: take-out marker ({marker[:120]}); "
                        f"powering off in {TAKE_OUT_GRACE_SECONDS:.0f} s",
                    )
                    self.narrator.host(now, f"{host.describe()} asks to be taken out: {marker[:120]}")
            elif not host.powered_off and now - host.taken_out_at >= TAKE_OUT_GRACE_SECONDS:
                host.powered_off = True
                reason = batch_rules.HOST_LOST_REASON.format(instance=host.instance_id)
                if run.running:
                    run.power_off(reason)
                    self._event(attempt, f"{host.describe()} powered off with node {run.index} still running")
                    self.narrator.host(now, f"{host.describe()} powered off with node {run.index} on it")
                else:
                    self._event(attempt, f"{host.describe()} powered off")
                    self.narrator.host(now, f"{host.describe()} powered off")

    # -- what Batch would answer ---------------------------------------------------------------------------
    def describe(self, ids: list[str]) -> list[dict[str, Any]]:
        """DescribeJobs entries for the job's node jobs (`<id>#<n>`) and the job itself, as the launcher's
        node watch sees them (a batch-lag fault delays what it sees; the engine's own decisions never lag)."""
        job, attempt = getattr(self, "job", None), getattr(self, "attempt", None)
        if job is None or attempt is None:
            return []
        found = []
        now = time.monotonic()
        for wanted in ids:
            base, _, index = wanted.partition("#")
            if base != job.job_id:
                continue
            if not index:
                found.append({"jobId": job.job_id, "jobName": job.spec.name, "status": "RUNNING"})
            elif index.isdigit() and int(index) < len(attempt.nodes):
                found.append(node_job(job, attempt, int(index), now=now, lag=self.player.lag))
        return found

    def _event(self, attempt: Attempt | None, text: str) -> None:
        """A line of the attempt's timeline; a fault's (and the job's own) lines also go to the rehearsal's."""
        stamp = time.monotonic()
        if attempt is not None:
            attempt.events.append((stamp, text))
        if attempt is None or text.startswith("fault "):
            self.result.fired.append((stamp, text))
        if text.startswith("fault ") or " armed: " in text:  # the fault player's lines
            self.narrator.fault(stamp, text)
