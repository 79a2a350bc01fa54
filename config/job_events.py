"""What trainctl and the stacks agree on about job events: the reason `trainctl cancel` gives
TerminateJob, which the job-alert rule leaves out (a deliberate cancel pages nobody).

TerminateJob's reason "is returned by future DescribeJobs operations on the job" (API TerminateJob,
reason): it becomes the job's statusReason, the field the job state change event carries.
"""

# Every reason trainctl gives starts with this; the alert rule matches it as a prefix.
TRAINCTL_CANCEL_PREFIX = "cancelled with trainctl"
TRAINCTL_CANCEL_REASON = f"{TRAINCTL_CANCEL_PREFIX} cancel"

# `trainctl run --image` registers its revisions in a family of its own beside the deployed job
# definition's: `<deployed name>-trainctl` (trainctl/submitting/preflight.py). The capacity resubmitter may submit
# jobs of both families (training_constructs/jobs/capacity_fallback).
TRAINCTL_FAMILY_SUFFIX = "-trainctl"
