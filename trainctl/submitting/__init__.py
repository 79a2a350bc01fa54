"""Submitting a job: what `submit`, `run` and `sweep` build and check before SubmitJob.

requests: SubmitJob requests from the command line, without calling AWS; taskfile: a job described in a
file (`run TASK.yaml`); workdir: the code that goes with a job; preflight: what is refused because it
could never run; estimate: the price before launch and the budget's refusal.
"""
