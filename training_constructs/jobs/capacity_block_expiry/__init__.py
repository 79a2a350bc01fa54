"""A Capacity Block's last 40 minutes: its placement's jobs are stopped for their final checkpoint (construct.py);
the Lambda handler is stop_jobs.py."""
