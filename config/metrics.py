"""CloudWatch names shared by what emits metrics (the launcher, the benchmark, node scripts) and what
reads them (the dashboard and alarms). Some are emitted for people to graph and read nothing here:
the benchmark's bus bandwidth, GPU power and the cold-start seconds. Container scripts cannot import
this package; they repeat the strings, and tests pin them to these constants."""

# One custom namespace for everything this app emits.
NAMESPACE = "TrainingPlatform"
# Dimensions: a fleet, and one node of it. Nothing finer, so the metric count stays bounded.
FLEET_DIMENSION = "Fleet"
INSTANCE_DIMENSION = "InstanceId"
# The environment variable every job definition sets to its fleet's name (the Fleet dimension).
FLEET_ENV = "TRAINING_FLEET"

# Fleet check (the benchmark job): bus bandwidth in Gbps and the verdict as a number
# (1 healthy, 0.75 uncalibrated: nothing published to judge by, 0.5 degraded, 0 failing), emitted by rank 0.
BENCHMARK_BUSBW = "BenchmarkBusBandwidthGbps"
BENCHMARK_VERDICT = "BenchmarkVerdict"
# Boot-time host check: 1 when a node failed it, 0 when it passed; emitted twice per node, with
# dimensions [Fleet] (any failure: the fleet's boot-check alarm) and [Fleet, Fault], Fault one of
# BOOT_FAULTS: node (this instance is bad: it powers off; the circuit breaker counts these), shared
# (every node of the fleet has it: the node registers and jobs are refused) or none (passed).
BOOT_CHECK_FAILED = "BootCheckFailed"
FAULT_DIMENSION = "Fault"
BOOT_FAULTS = ("node", "shared", "none")

# Job metrics, counted from AWS Batch "Batch Job State Change" events of the app's queues (one
# metric per state a job enters; dimension Fleet only, a job is not bound to one instance).
JOB_STATE_METRICS = {
    "SUBMITTED": "JobsSubmitted",
    "RUNNABLE": "JobsRunnable",
    "STARTING": "JobsStarting",
    "RUNNING": "JobsStarted",
    "SUCCEEDED": "JobsSucceeded",
    "FAILED": "JobsFailed",
}

# Node metrics (dimensions Fleet and InstanceId), sent by the node collector every minute through
# the CloudWatch agent. EFA counters are summed over a node's devices and ports, per minute.
NODE_HEARTBEAT = "NodeHeartbeat"
XID_ERRORS = "GpuXidErrors"
# Power of all a node's GPUs, in watts, from `nvidia-smi --query-gpu=power.draw`: the agent's
# nvidia_gpu power_draw reads <power_draw>, which drivers writing the v13 XML schema (580) no longer
# have (they write average_power_draw and instant_power_draw; tests read the H100 fixture).
GPU_POWER = "GpuPowerDrawWatts"
EFA_COUNTER_METRICS = {
    "tx_bytes": "EfaTxBytes",
    "rx_bytes": "EfaRxBytes",
    "rdma_read_bytes": "EfaRdmaReadBytes",
    "rdma_write_bytes": "EfaRdmaWriteBytes",
    "retrans_pkts": "EfaRetransmittedPackets",
    "retrans_timeout_events": "EfaRetransmitTimeouts",
    "rx_drops": "EfaRxDrops",
    "unresponsive_remote_events": "EfaUnresponsiveRemoteEvents",
    "impaired_remote_conn_events": "EfaImpairedRemoteConnections",
}
# The CloudWatch agent's nvidia_gpu input names its metrics nvidia_smi_<measurement>.
GPU_MEASUREMENTS = ("utilization_gpu", "memory_used", "temperature_gpu")
GPU_UTILIZATION = "nvidia_smi_utilization_gpu"
# Cold start of one node (container/launcher/cold_start.py, one line per node): the image pull, container
# start to the launcher, the fabric preflight, and torchrun's start to its first worker (rendezvous).
COLD_START_IMAGE_PULL = "ColdStartImagePullSeconds"
COLD_START_CONTAINER_TO_LAUNCHER = "ColdStartContainerToLauncherSeconds"
COLD_START_PREFLIGHT = "ColdStartPreflightSeconds"
COLD_START_RENDEZVOUS = "ColdStartRendezvousSeconds"
# Self-healing (issue 31), dimension Fleet: a node that took itself out after a node fault as the job
# reported it (an EMF line from container/launcher/node_fault.py in the job's own log: any job can print
# it, so it is graphed and alerts, and the circuit breaker never counts it), and a job Batch retried after
# a failed attempt (from Batch job state change events, training_constructs/observability/job_metrics.py).
NODES_TAKEN_OUT = "NodesTakenOut"
JOBS_RESUMED = "JobsResumed"
# A take-out as the host judged it (issue 52), dimension Fleet: 1 when the host's own check (device counts,
# node-fault Xids in the kernel log) found a node fault, 0 when it did not; sent by the host
# (node_scripts/boot_check.py confirm) to the fleet's boot-check log group, which jobs cannot write. The
# circuit breaker counts these with boot-check node faults.
TAKE_OUT_CONFIRMED = "TakeOutConfirmed"
# A window in which the straggler watch found a node slower than the others (issue 54), dimension Fleet, one
# per slow window with the job, node, rank, instance, AZ and ratio as properties; printed by
# container/launcher/straggler_watch.py in the job's own log, so graphed and alarmed on, never acted on.
STRAGGLER_WINDOWS = "StragglerWindows"

# Capacity fallback (training_constructs/jobs/capacity_fallback): jobs a placement's queue cancelled for
# lack of capacity (dimensions Fleet and Placement: 0 is the fleet's own, 1.. its fallback ones), and
# jobs sent on to a later placement (dimension Fleet), counted from the resubmitter's log lines.
PLACEMENT_DIMENSION = "Placement"
CAPACITY_CANCELS = "CapacityCancels"
FALLBACK_RESUBMITS = "FallbackResubmits"
