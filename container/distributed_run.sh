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
# On Batch it also:
#   - pins NCCL's and gloo's bootstrap sockets to the task ENI: NCCL_SOCKET_IFNAME and
#     GLOO_SOCKET_IFNAME default to eth0, because awsvpc containers also have ecs-eth0, the ECS
#     credentials bridge, which peers cannot reach (NVIDIA/nccl#859);
#   - waits RDZV_JOIN_TIMEOUT seconds (default 1800) for every node to join: Batch starts children
#     only after the main node runs, and each pulls a multi-GB image (torch's default is 600 s).
# Fabric preflight, wherever the variables are set: fewer uverbs devices under EFA_DEVICE_DIR
# (default /dev/infiniband) than EFA_DEVICES, or fewer GPUs than EXPECTED_GPUS, stops the node
# with one line naming expected and found, before anything starts.
# Checkpoints, with CHECKPOINT_URI (s3://bucket/prefix) set: every node restores
# CHECKPOINT_URI/<job id>/ into CHECKPOINT_DIR (default /tmp/checkpoints) first, so that a retried
# attempt (same job id) resumes, and appends RESUME_ARGS to the script's arguments when anything
# was restored; the main node uploads CHECKPOINT_DIR every CHECKPOINT_SYNC_MINUTES (default 15)
# and when the script exits. checkpoint_sync.py (beside this file) does the copying, with
# CHECKPOINT_PYTHON (default: PYTHON, else python3).
# Cold start, on ECS (ECS_CONTAINER_METADATA_URI_V4 set): cold_start.py (beside this file, run with
# COLD_START_PYTHON, default: PYTHON, else python3) prints one embedded-metric JSON line per node
# with the image pull, container-to-launcher, preflight and rendezvous seconds.
# Exits with the training command's status (1 if it succeeded but the last upload failed).
set -euo pipefail
launcher_start="${EPOCHREALTIME:-$(date +%s)}"

readonly NAME="distributed_run.sh"
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
  local dir="${EFA_DEVICE_DIR:-/dev/infiniband}" found devices
  if [[ -n "${EFA_DEVICES:-}" ]]; then
    is_uint "$EFA_DEVICES" || die "EFA_DEVICES='$EFA_DEVICES' is not a non-negative integer"
    shopt -s nullglob
    devices=("$dir"/uverbs*)
    shopt -u nullglob
    found=${#devices[@]}
    [[ "$found" -ge "$EFA_DEVICES" ]] ||
      die "fabric preflight failed: expected $EFA_DEVICES EFA devices (uverbs*) in $dir, found $found; is the job definition's device list or the launch template's interface layout wrong?"
  fi
  if [[ -n "${EXPECTED_GPUS:-}" ]]; then
    is_uint "$EXPECTED_GPUS" || die "EXPECTED_GPUS='$EXPECTED_GPUS' is not a non-negative integer"
    found=$(count_gpus)
    [[ "$found" -ge "$EXPECTED_GPUS" ]] ||
      die "fabric preflight failed: expected $EXPECTED_GPUS GPUs (nvidia-smi --list-gpus), found $found"
  fi
}

checkpoint_sync() {
  "${CHECKPOINT_PYTHON:-${PYTHON:-python3}}" "$HERE/checkpoint_sync.py" "$@"
}

[[ $# -ge 1 ]] || die "usage: $NAME SCRIPT [ARGS...]"

nproc="${NPROC_PER_NODE:-$(count_accelerators)}"
is_uint "$nproc" && [[ "$nproc" -ge 1 ]] || die "NPROC_PER_NODE='$nproc' is not a positive integer"
port="${MASTER_PORT:-29500}"
is_uint "$port" && [[ "$port" -ge 1 && "$port" -le 65535 ]] || die "MASTER_PORT='$port' is not a port number (1..65535)"
sync_minutes="${CHECKPOINT_SYNC_MINUTES:-15}"
if ! [[ "$sync_minutes" =~ ^[0-9]*\.?[0-9]+$ ]] || ! awk -v m="$sync_minutes" 'BEGIN {exit !(m > 0)}'; then
  die "CHECKPOINT_SYNC_MINUTES='$sync_minutes' is not a positive number"
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

  export NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-eth0}"
  export GLOO_SOCKET_IFNAME="${GLOO_SOCKET_IFNAME:-eth0}"

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
  restored=$(checkpoint_sync restore "$checkpoint_uri" "$CHECKPOINT_DIR") ||
    die "cannot restore checkpoints from $checkpoint_uri (see the line above)"
  if [[ "$restored" -gt 0 && -n "${RESUME_ARGS:-}" ]]; then
    read -r -a resume <<<"$RESUME_ARGS"
    script+=("${resume[@]}")
  fi
fi

if [[ "$batch" -eq 0 ]]; then
  echo "$NAME: single node, $nproc processes: ${runner[*]} ${args[*]} ${script[*]}" >&2
else
  echo "$NAME: node $index of $nodes (rank $node_rank, main $main), $nproc processes, rendezvous $address:$port id $job_id: ${runner[*]} ${args[*]} ${script[*]}" >&2
fi

if [[ -n "${ECS_CONTAINER_METADATA_URI_V4:-}" ]]; then
  # In the background, watching this process (torchrun's, after the exec below) for its workers.
  "${COLD_START_PYTHON:-${PYTHON:-python3}}" "$HERE/cold_start.py" --launcher-start "$launcher_start" \
    --preflight-seconds "$(awk -v a="$preflight_start" -v b="$preflight_end" 'BEGIN {print b - a}')" \
    --watch-pid $$ --rendezvous-start "${EPOCHREALTIME:-$(date +%s)}" --rendezvous-timeout "${join_timeout:-60}" &
fi

if [[ -z "${CHECKPOINT_URI:-}" || "$is_main" -eq 0 ]]; then
  exec "${runner[@]}" "${args[@]}" "${script[@]}"
fi

# Main node with checkpoints: train in the background, upload on a timer and at the end.
"${runner[@]}" "${args[@]}" "${script[@]}" &
training=$!
trap 'kill -TERM "$training" 2>/dev/null || true' TERM INT
sync_seconds=$(awk -v m="$sync_minutes" 'BEGIN {printf "%d", (m * 60 < 1 ? 1 : m * 60)}')
(
  trap 'kill "$nap" 2>/dev/null; exit 0' TERM
  while true; do
    sleep "$sync_seconds" &
    nap=$!
    wait "$nap"
    checkpoint_sync upload "$CHECKPOINT_DIR" "$checkpoint_uri" >/dev/null ||
      echo "$NAME: periodic checkpoint upload to $checkpoint_uri failed; training goes on" >&2
  done
) &
syncer=$!
status=0
wait "$training" || status=$?
# A TERM (Batch stopping the job) interrupts the first wait; wait again for the training to end.
while kill -0 "$training" 2>/dev/null; do
  wait "$training" || status=$?
done
kill "$syncer" 2>/dev/null || true
wait "$syncer" 2>/dev/null || true
if ! checkpoint_sync upload "$CHECKPOINT_DIR" "$checkpoint_uri" >/dev/null; then
  echo "$NAME: final checkpoint upload to $checkpoint_uri FAILED; results of this attempt are only on this node" >&2
  [[ "$status" -ne 0 ]] || status=1
fi
exit "$status"
