"""CloudWatch names shared by what emits metrics (the launcher, the benchmark, node scripts) and what
reads them (dashboard, alarms, trainctl). Container scripts cannot import this package; they repeat
the strings, and tests pin them to these constants."""

# One custom namespace for everything this app emits.
NAMESPACE = "TrainingPlatform"
# Dimensions: a fleet, and one node of it. Nothing finer, so the metric count stays bounded.
FLEET_DIMENSION = "Fleet"
INSTANCE_DIMENSION = "InstanceId"
# The environment variable every job definition sets to its fleet's name (the Fleet dimension).
FLEET_ENV = "TRAINING_FLEET"

# Fleet check (the benchmark job): bus bandwidth in Gbps and the verdict as a number
# (1 healthy, 0.5 degraded, 0 failing), emitted by rank 0.
BENCHMARK_BUSBW = "BenchmarkBusBandwidthGbps"
BENCHMARK_VERDICT = "BenchmarkVerdict"
# Boot-time host check: 1 when a node failed it, 0 when it passed.
BOOT_CHECK_FAILED = "BootCheckFailed"
# Cold start of one node (container/cold_start.py, one line per node): the image pull, container
# start to the launcher, the fabric preflight, and torchrun's start to its first worker (rendezvous).
COLD_START_IMAGE_PULL = "ColdStartImagePullSeconds"
COLD_START_CONTAINER_TO_LAUNCHER = "ColdStartContainerToLauncherSeconds"
COLD_START_PREFLIGHT = "ColdStartPreflightSeconds"
COLD_START_RENDEZVOUS = "ColdStartRendezvousSeconds"
