"""Bounds the context values must respect: AWS's limits, each with its source, and this app's own
guards where AWS allows more than makes sense."""

# AWS Batch multi-node parallel jobs: at most 1,000 nodes (Batch user guide, multi-node-parallel-jobs).
MAX_NODES = 1000
# A multi-node job needs at least two nodes; a single node is an ordinary Batch job.
MIN_NODES = 2
# CloudFormation allows 500 resources and 200 outputs per stack; a fleet adds 5 resources to the
# compute stack and 4 outputs to the jobs stack (40 fleets, the all-types synth: compute 280
# resources, jobs 254 resources and 164 outputs; tests/test_compute.py extrapolates the synth to
# this limit, so the jobs stack's outputs cap it at 48). 40 holds every EFA-capable catalog type as
# its own fleet, with 36 outputs to spare for what later stacks add.
MAX_FLEETS = 40
# Training subnets are /18: the VPC's two (10.0.64.0/18 and 10.0.128.0/18 in its first two AZs),
# and one per AZ the user names, each in a VPC CIDR block of its own (training_constructs/network/az_subnet.py).
TRAINING_SUBNET_MASK = 18
# A VPC holds 5 IPv4 CIDR blocks, the primary one included, unless the quota is raised (up to 50;
# AWS General Reference, "Amazon VPC endpoints and quotas", IPv4 CIDR blocks per VPC).
VPC_CIDR_BLOCKS = 5
# Named-AZ subnets (one block each) a deployment may hold: one fewer than the quota leaves after the
# primary block, because moving a fleet to another AZ creates the new AZ's block before the old one
# is deleted (CloudFormation deletes removed resources only in its cleanup phase, after every
# create), so a move needs one block more for a moment. tests/test_replay.py replays that peak.
MAX_NAMED_AZ_BLOCKS = VPC_CIDR_BLOCKS - 2
# Private IPv4 addresses a training subnet can hand out: AWS reserves the first four and the last
# address of every subnet (VPC user guide, "Subnet CIDR blocks").
TRAINING_SUBNET_ADDRESSES = 2 ** (32 - TRAINING_SUBNET_MASK) - 5
# Each node takes one address per launch-template interface (every EFA one is `efa`, EFA with ENA,
# plus an ENA-only primary where card 0 has no EFA: InstanceSpec.node_interfaces, see
# training_constructs/compute/efa_launch_template.py) and one for the job's awsvpc task ENI.
TASK_ENIS_PER_NODE = 1
# A ParallelCluster Slurm node (the pinned release) with EFA has one interface with an IP address (ENA on network
# card 0) and `efa-only` interfaces, which take none, on the others (pcluster/templates/queues_stack.py,
# the compute launch template's network interfaces). The head node takes one more.
SLURM_ADDRESSES_PER_NODE = 1
# Values CloudWatch Logs accepts for RetentionInDays (CloudWatch Logs API, PutRetentionPolicy).
LOG_RETENTION_DAYS = (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557)
LOG_RETENTION_DAYS += (2922, 3288, 3653)
# ParallelCluster (the pinned release) accepts only these for Monitoring/Logs/CloudWatch/RetentionInDays (0 is
# its own "never expire"), so 1096, 2192, 2557, 2922 and 3288 fail at cluster create
# (pcluster/schemas/cluster_schema.py, CloudWatchLogsSchema.retention_in_days).
PCLUSTER_LOG_RETENTION_DAYS = (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1827, 3653)
# Root volume: big training images (Isaac Sim, Neuron DLC) unpack to tens of GiB each. gp3 limits:
# 16 TiB, 125..1000 MiB/s, 3000..16000 IOPS, at most 0.25 MiB/s per provisioned IOPS (EBS user
# guide, "General Purpose SSD volumes").
MIN_ROOT_GIB, MAX_ROOT_GIB = 100, 16384
GP3_THROUGHPUT, GP3_IOPS, GP3_MIBPS_PER_IOPS = (125, 1000), (3000, 16000), 0.25
# Job attempt timeout: Batch's minimum is 60 s (API JobTimeout). The 14-day ceiling is this app's,
# so that a forgotten job on a large fleet cannot bill for weeks; submit-job --timeout can go higher.
JOB_TIMEOUT_SECONDS = (60, 14 * 24 * 3600)
# Batch retry strategy: 1..10 attempts (API RetryStrategy).
MAX_ATTEMPTS = 10
# Job queue jobStateTimeLimitActions: maxTimeSeconds 600..86400 (API JobStateTimeLimitAction).
RUNNABLE_TIMEOUT_MINUTES = (10, 1440)
# Fair-share identifiers: up to 255 alphanumeric characters, optionally ending in '*' for a prefix;
# at most 500 active in a queue (API ShareAttributes). Shares are relative: 1..1000.
MAX_SHARE_IDENTIFIERS, MAX_SHARE = 500, 1000
# FSx for Lustre PERSISTENT_2 (SSD): 1200 GiB, 2400 GiB, then steps of 2400 GiB; throughput 125,
# 250, 500 or 1000 MB/s per TiB (FSx for Lustre user guide, "Managing storage capacity" and
# "Performance"). The upper bound is this app's, a guard against a typo costing a fortune.
FSX_CAPACITY_STEP_GIB = 2400
FSX_MIN_CAPACITY_GIB = 1200
FSX_MAX_CAPACITY_GIB = 100 * FSX_CAPACITY_STEP_GIB
FSX_THROUGHPUTS = (125, 250, 500, 1000)
# Interface endpoints the network stack can add on request (short service names).
INTERFACE_ENDPOINTS = ("batch", "ec2messages", "ecr.api", "ecr.dkr", "ecs", "ecs-agent", "ecs-telemetry", "logs")
INTERFACE_ENDPOINTS += ("monitoring", "ssm", "ssmmessages", "sts")

# healthCheckSchedule: the longest rate. The missing-verdict alarm looks back over the interval plus
# the check's own time in one-hour periods, and an alarm's evaluation range is at most seven days
# (CloudWatch API PutMetricAlarm, Period: Period x EvaluationPeriods at most 604,800 s).
MAX_HEALTH_CHECK_DAYS = 6
# ScheduleExpression of an EventBridge rule and of a Scheduler schedule: at most 256 characters
# (the AWS::Events::Rule and AWS::Scheduler::Schedule resource schemas cfn-lint ships).
MAX_SCHEDULE_EXPRESSION = 256
