#!/usr/bin/env bash
# Launch a PyTorch script on every node of an AWS Batch multi-node parallel (MNP) job.
#
#   distributed_run.sh train.py --flag value
#
# Maps the Batch MNP variables to torch.distributed.run (torchrun):
#   AWS_BATCH_JOB_NUM_NODES          -> --nnodes
#   AWS_BATCH_JOB_NODE_INDEX         -> --node_rank (shifted so that the main node is rank 0)
#   AWS_BATCH_JOB_MAIN_NODE_INDEX    -> which node hosts the rendezvous
#   AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS (set on child nodes only) -> rendezvous host;
#                                       the main node uses its own private address
#   AWS_BATCH_JOB_ID ("<id>#<node>") -> --rdzv_id, everything from '#' stripped, so all nodes agree
# Optional: MASTER_ADDR (wins over the above), MASTER_PORT (default 29500), NPROC_PER_NODE
# (default: the GPUs or NeuronCores found, else 1), PYTHON (run "$PYTHON -m torch.distributed.run",
# e.g. Isaac Sim's python.sh; default torchrun). Without Batch variables it runs one node.
#
# With Batch variables (Batch, or Slurm through examples/slurm) it also:
#   - pins NCCL's and gloo's bootstrap sockets (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME, unless set)
#     to eth0 inside an ECS awsvpc task (the task ENI; ecs-eth0 is the unreachable ECS credentials
#     bridge, NVIDIA/nccl#859), elsewhere to the default route's interface (preflight.py);
#   - waits RDZV_JOIN_TIMEOUT seconds (default 1800) for every node to join: Batch starts children
#     only after the main node runs, and each pulls a multi-GB image (torch's default is 600 s).
# Preflight (preflight.py beside this file, run with PREFLIGHT_PYTHON, default python3, else PYTHON):
# EFA devices and libfabric's EFA provider (EFA_DEVICES, EFA_DEVICE_DIR), GPUs (EXPECTED_GPUS), a
# Vulkan GPU (EXPECT_VULKAN=1), Neuron devices and tools (EXPECTED_NEURON_DEVICES). A node that fails
# prints one line naming the node, expected and found, and exits 75 before anything starts; the job
# definitions retry exit 75.
# Checkpoints, with CHECKPOINT_URI (s3://bucket/prefix) set: every node restores its last complete
# set (and the main node's) from CHECKPOINT_URI/<job id>/ into CHECKPOINT_DIR (default
# /tmp/checkpoints) first, so that a retried attempt (same job id) resumes, and appends RESUME_ARGS
# to the script's arguments when anything was restored. While the script runs, every node uploads
# its new complete files every CHECKPOINT_SYNC_SECONDS (default 60; CHECKPOINT_SYNC_MINUTES is still
# honoured), complete meaning renamed into place, or closed and unchanged for
# CHECKPOINT_SETTLE_SECONDS (default 30). A SIGTERM goes to torchrun at once and starts the last
# uploads while the workers exit. checkpoint_sync.py (beside this file) does the copying, with
# CHECKPOINT_PYTHON (default: PYTHON, else python3).
# Cold start, on ECS (ECS_CONTAINER_METADATA_URI_V4 set): cold_start.py (beside this file, run with
# COLD_START_PYTHON, default: PYTHON, else python3) prints one embedded-metric JSON line per node
# with the image pull, container-to-launcher, preflight and rendezvous seconds.
# Exits with the training command's status (1 if it succeeded but the last upload failed).
set -euo pipefail
launcher_start="${EPOCHREALTIME:-$(date +%s)}"
# A stop (SIGTERM) before training starts is remembered: as the container's PID 1, bash would
# otherwise ignore it, and the node would start training only to be SIGKILLed later.
stop_requested=0
trap 'stop_requested=1' TERM INT

readonly NAME="distributed_run.sh"
# A failed preflight (preflight.py PREFLIGHT_EXIT): the one exit code the job definitions retry.
readonly PREFLIGHT_EXIT=75
# The fleet's AMI or image cannot train on this GPU (preflight.py IMAGE_EXIT): not retried.
readonly IMAGE_EXIT=78
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
readonly HERE

die() {
  echo "$NAME: $*" >&2
  exit 2
}

is_uint() {
  [[ "$1" =~ ^[0-9]+$ ]]
}

count_gpus() {
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --list-gpus 2>/dev/null | grep -c '^GPU ' || true
  else
    echo 0
  fi
}

count_accelerators() {
  local count
  count=$(count_gpus)
  if [[ "$count" -gt 0 ]]; then
    echo "$count"
    return
  fi
  if command -v neuron-ls >/dev/null 2>&1; then
    # Sum the NeuronCores of every Neuron device ("nc_count" in neuron-ls JSON output).
    count=$(neuron-ls --json-output 2>/dev/null | grep -o '"nc_count": *[0-9]*' | grep -o '[0-9]*$' |
      awk '{s += $1} END {print s + 0}')
    if [[ "$count" -gt 0 ]]; then
      echo "$count"
      return
    fi
  fi
  echo 1
}

own_address() {
  local address
  address=$(hostname -I 2>/dev/null | awk '{print $1}')
  [[ -n "$address" ]] || die "cannot find this node's private IPv4 address (hostname -I); set MASTER_ADDR"
  echo "$address"
}

preflight() {
  local python="${PREFLIGHT_PYTHON:-}" output status=0
  # Stdlib only: a plain python3 starts fastest; Isaac Sim's python.sh where there is none.
  if [[ -z "$python" ]]; then
    python=$(command -v python3 || echo "${PYTHON:-python3}")
  fi
  output=$("$python" "$HERE/preflight.py") || status=$?
  # preflight.py printed the line: a failed check, or (2) a malformed variable.
  [[ "$status" -ne "$PREFLIGHT_EXIT" && "$status" -ne "$IMAGE_EXIT" && "$status" -ne 2 ]] || exit "$status"
  [[ "$status" -eq 0 ]] || die "preflight.py could not check this node (exit $status, see above)"
  # Only its own line counts: an interpreter's wrapper may print more.
  socket_interface=$(sed -n 's/^socket_interface=//p' <<<"$output" | tail -n 1)
}

positive() {
  if ! [[ "$2" =~ ^[0-9]*\.?[0-9]+$ ]] || ! awk -v m="$2" 'BEGIN {exit !(m > 0)}'; then
    die "$1='$2' is not a positive number"
  fi
}

# Sets `waited` to the exit status of background job $1, waiting again while a trapped signal
# interrupts the wait.
wait_status() {
  while true; do
    waited=0
    wait "$1" || waited=$?
    kill -0 "$1" 2>/dev/null || break
  done
}

checkpoint_sync() {
  "${CHECKPOINT_PYTHON:-${PYTHON:-python3}}" "$HERE/checkpoint_sync.py" "$@"
}

[[ $# -ge 1 ]] || die "usage: $NAME SCRIPT [ARGS...]"

nproc="${NPROC_PER_NODE:-$(count_accelerators)}"
is_uint "$nproc" && [[ "$nproc" -ge 1 ]] || die "NPROC_PER_NODE='$nproc' is not a positive integer"
port="${MASTER_PORT:-29500}"
is_uint "$port" && [[ "$port" -ge 1 && "$port" -le 65535 ]] || die "MASTER_PORT='$port' is not a port number (1..65535)"
if [[ -n "${CHECKPOINT_URI:-}" ]]; then
  if [[ -z "${CHECKPOINT_SYNC_SECONDS:-}" && -n "${CHECKPOINT_SYNC_MINUTES:-}" ]]; then
    positive CHECKPOINT_SYNC_MINUTES "$CHECKPOINT_SYNC_MINUTES"
    CHECKPOINT_SYNC_SECONDS=$(awk -v m="$CHECKPOINT_SYNC_MINUTES" 'BEGIN {print m * 60}')
  fi
  sync_seconds="${CHECKPOINT_SYNC_SECONDS:-60}"
  settle_seconds="${CHECKPOINT_SETTLE_SECONDS:-30}"
  positive CHECKPOINT_SYNC_SECONDS "$sync_seconds"
  [[ "$settle_seconds" =~ ^[0-9]*\.?[0-9]+$ ]] || die "CHECKPOINT_SETTLE_SECONDS='$settle_seconds' is not a number of seconds (0 or more)"
fi
preflight_start="${EPOCHREALTIME:-$(date +%s)}"
preflight
preflight_end="${EPOCHREALTIME:-$(date +%s)}"

if [[ -z "${PYTHON:-}" ]] && command -v torchrun >/dev/null 2>&1; then
  runner=(torchrun)
else
  runner=("${PYTHON:-python3}" -m torch.distributed.run)
fi

job_id="${AWS_BATCH_JOB_ID:-local}"
job_id="${job_id%%#*}"
batch=0
if [[ -n "${AWS_BATCH_JOB_NUM_NODES:-}" || -n "${AWS_BATCH_JOB_NODE_INDEX:-}" ]]; then
  batch=1
fi

if [[ "$batch" -eq 0 ]]; then
  args=(--standalone --nnodes=1 --nproc_per_node="$nproc")
  is_main=1
else
  nodes="${AWS_BATCH_JOB_NUM_NODES:-}"
  index="${AWS_BATCH_JOB_NODE_INDEX:-}"
  main="${AWS_BATCH_JOB_MAIN_NODE_INDEX:-0}"
  join_timeout="${RDZV_JOIN_TIMEOUT:-1800}"
  is_uint "$nodes" && [[ "$nodes" -ge 1 ]] || die "AWS_BATCH_JOB_NUM_NODES='$nodes' is not a positive integer"
  is_uint "$index" || die "AWS_BATCH_JOB_NODE_INDEX='$index' is not a non-negative integer"
  is_uint "$main" || die "AWS_BATCH_JOB_MAIN_NODE_INDEX='$main' is not a non-negative integer"
  [[ "$index" -lt "$nodes" ]] || die "AWS_BATCH_JOB_NODE_INDEX=$index is not below AWS_BATCH_JOB_NUM_NODES=$nodes"
  [[ "$main" -lt "$nodes" ]] || die "AWS_BATCH_JOB_MAIN_NODE_INDEX=$main is not below AWS_BATCH_JOB_NUM_NODES=$nodes"
  is_uint "$join_timeout" && [[ "$join_timeout" -ge 1 ]] || die "RDZV_JOIN_TIMEOUT='$join_timeout' is not a positive integer"

  if [[ -n "$socket_interface" ]]; then
    export NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-$socket_interface}"
    export GLOO_SOCKET_IFNAME="${GLOO_SOCKET_IFNAME:-$socket_interface}"
  fi

  # The main node hosts the rendezvous and must be rank 0, whatever its Batch index.
  node_rank=$(((index - main + nodes) % nodes))
  if [[ "$index" -eq "$main" ]]; then
    is_main=1
    address="${MASTER_ADDR:-$(own_address)}"
  else
    is_main=0
    address="${MASTER_ADDR:-${AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS:-}}"
    [[ -n "$address" ]] || die "child node $index has neither MASTER_ADDR nor AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"
  fi
  args=(
    --nnodes="$nodes"
    --node_rank="$node_rank"
    --nproc_per_node="$nproc"
    --rdzv_backend=c10d
    --rdzv_endpoint="$address:$port"
    --rdzv_id="$job_id"
    --rdzv_conf="is_host=$is_main,join_timeout=$join_timeout"
  )
fi

script=("$@")
if [[ -n "${CHECKPOINT_URI:-}" ]]; then
  [[ "$CHECKPOINT_URI" == s3://?* ]] || die "CHECKPOINT_URI='$CHECKPOINT_URI' is not an s3:// URI"
  export CHECKPOINT_DIR="${CHECKPOINT_DIR:-/tmp/checkpoints}"
  mkdir -p "$CHECKPOINT_DIR"
  checkpoint_uri="${CHECKPOINT_URI%/}/$job_id/"
  state=$(mktemp -d)
  # Each node keeps its own files under node-<Batch node index>; the main node's set is restored
  # on every node too.
  node_args=(--uri "$checkpoint_uri" --node "${index:-0}" --main "${main:-0}" --state-dir "$state")
  # The count is checkpoint_sync.py's last line: an interpreter wrapper (Isaac Sim's python.sh)
  # may print before it.
  restored=$(checkpoint_sync restore "${node_args[@]}" "$CHECKPOINT_DIR" | tail -n 1) ||
    die "cannot restore checkpoints from $checkpoint_uri (see the line above)"
  is_uint "$restored" || die "checkpoint_sync.py restore printed '$restored', not a file count"
  # RESUME_GLOB (optional, a file-name pattern): resume only when a restored file matches it, e.g.
  # model_*.pt, and put the folder of the newest match (by its restored mtime) where RESUME_ARGS says
  # {resume_dir}. Isaac Lab's resume otherwise takes the newest run folder by name, which may hold
  # only the configuration another rank wrote, and fails on it.
  if [[ "$restored" -gt 0 && -n "${RESUME_ARGS:-}" ]]; then
    resume_args="$RESUME_ARGS"
    if [[ -n "${RESUME_GLOB:-}" ]]; then
      [[ "$RESUME_GLOB" != */* ]] || die "RESUME_GLOB='$RESUME_GLOB' is a file-name pattern; it cannot name a folder"
      newest=$(find "$CHECKPOINT_DIR" -name "$RESUME_GLOB" -type f -printf '%T@ %h\n' | sort -n | tail -n 1)
      resume_args=${newest:+${resume_args//\{resume_dir\}/$(basename "${newest#* }")}}
    fi
    if [[ -n "$resume_args" ]]; then
      read -r -a resume <<<"$resume_args"
      script+=("${resume[@]}")
    fi
  fi
fi

if [[ "$batch" -eq 0 ]]; then
  echo "$NAME: single node, $nproc processes: ${runner[*]} ${args[*]} ${script[*]}" >&2
else
  echo "$NAME: node $index of $nodes (rank $node_rank, main $main), $nproc processes, rendezvous $address:$port id $job_id: ${runner[*]} ${args[*]} ${script[*]}" >&2
fi

if [[ -n "${ECS_CONTAINER_METADATA_URI_V4:-}" ]]; then
  # In the background, watching this process's descendants (torchrun's, after the exec below, or
  # the backgrounded torchrun's with checkpoints) for its first worker.
  "${COLD_START_PYTHON:-${PYTHON:-python3}}" "$HERE/cold_start.py" --launcher-start "$launcher_start" \
    --preflight-seconds "$(awk -v a="$preflight_start" -v b="$preflight_end" 'BEGIN {print b - a}')" \
    --watch-pid $$ --rendezvous-start "${EPOCHREALTIME:-$(date +%s)}" --rendezvous-timeout "${join_timeout:-60}" &
fi

if [[ "$stop_requested" -ne 0 ]]; then
  echo "$NAME: stopped (SIGTERM) before training started" >&2
  exit 143
fi
if [[ -z "${CHECKPOINT_URI:-}" ]]; then
  exec "${runner[@]}" "${args[@]}" "${script[@]}"
fi

# With checkpoints: train in the background while checkpoint_sync.py uploads complete files. It
# learns of a stop and of the trainer's exit status through files in $state.
"${runner[@]}" "${args[@]}" "${script[@]}" &
training=$!
# shellcheck disable=SC2329 # called by the trap below
stop_training() {
  kill -TERM "$training" 2>/dev/null || true
  [[ -e "$state/stopping" ]] || echo "$EPOCHREALTIME" >"$state/stopping"
}
trap stop_training TERM INT
# A stop that came between the check above and this trap.
[[ "$stop_requested" -eq 0 ]] || stop_training
checkpoint_sync watch "${node_args[@]}" --pid "$training" \
  --sync-seconds "$sync_seconds" --settle-seconds "$settle_seconds" "$CHECKPOINT_DIR" &
syncer=$!
wait_status "$training"
status=$waited
# A crash counts back from its own time, like a stop.
if [[ "$status" -ne 0 && ! -e "$state/stopping" ]]; then
  echo "$EPOCHREALTIME" >"$state/stopping"
fi
echo "$status" >"$state/status.tmp" && mv "$state/status.tmp" "$state/status"
wait_status "$syncer"
synced=$waited
rm -rf "$state"
if [[ "$synced" -ne 0 ]]; then
  echo "$NAME: final checkpoint upload to $checkpoint_uri FAILED; results of this attempt are only on this node" >&2
  [[ "$status" -ne 0 ]] || status=1
fi
exit "$status"
