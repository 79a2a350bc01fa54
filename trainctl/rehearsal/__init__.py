"""`trainctl rehearse`: a whole multi-node job run on this machine as AWS Batch would run it.

definition: the job definition as it would be deployed (cdk.out, or the deployed revision) with the
task file's overrides; batch_rules: what Batch decides (retries, timeouts, the variables it sets);
hosts: simulated instances that outlive attempts; local_s3: the checkpoint bucket on 127.0.0.1;
faults: what a rehearsal can break and when; engine: the job's attempts; report: what happened;
catalog: every fault with the ending users need (`make faults`).
"""
