"""Inspecting jobs: what `jobs`, `show`, `logs`, `why`, `checkpoints`, `cancel` and `exec` read.

handles: the JOB a command takes (an id, a prefix of one, or a name); listing: the deployment's jobs and
their table; showing: one job whole, node by node; logs: every node's stream, interleaved; why: why a job
is not running; recovery: the story of every attempt; lineage: a job and the jobs the capacity fallback
resubmitted it as; checkpoints: a job's checkpoints; ecs_exec: a shell in one node's container.
"""
