"""L3 building blocks of the training platform, one subpackage per capability: network, compute,
jobs, images, health, observability, cluster (ParallelCluster), data, and common (what they share).
Import from the subpackage's module, e.g. `from training_constructs.jobs.training_jobs import TrainingJobs`.

Named `training_constructs`, not `constructs`: a top-level package called `constructs` would
shadow the `constructs` library that aws-cdk-lib imports.
"""
