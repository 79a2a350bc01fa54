"""What trainctl and the stacks agree on about job events: the reasons the platform gives TerminateJob when
it ends a job on purpose (`trainctl cancel`, the team budgets), which the job-alert rule leaves out (a
deliberate stop pages nobody).

TerminateJob's reason "is returned by future DescribeJobs operations on the job" (API TerminateJob,
reason): it becomes the job's statusReason, the field the job state change event carries.
"""

# Every reason the platform ends a job with on purpose starts with this: `trainctl cancel`'s and the budget
# enforcement's (budget_ledger/ledger.py BATCH_REASON_PREFIX, which tests pin to it). One prefix lets the
# alert rule use EventBridge's documented single `anything-but` prefix form.
QUIET_REASON_PREFIX = "trainctl "
TRAINCTL_CANCEL_REASON = f"{QUIET_REASON_PREFIX}cancel: cancelled on request"

# `trainctl run --image` registers its revisions in a family of its own beside the deployed job
# definition's: `<deployed name>-trainctl` (trainctl/submitting/preflight.py). The capacity resubmitter may submit
# jobs of both families (training_constructs/jobs/capacity_fallback).
TRAINCTL_FAMILY_SUFFIX = "-trainctl"
