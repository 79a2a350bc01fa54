"""The optional AWS ParallelCluster (Slurm) cluster: its configuration and the stack resource that runs it."""
