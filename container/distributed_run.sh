#!/usr/bin/env bash
# Launch a PyTorch script on every node of an AWS Batch multi-node parallel (MNP) job.
#
#   distributed_run.sh train.py --flag value
#
# Maps the Batch MNP variables to torch.distributed.run (torchrun):
#   AWS_BATCH_JOB_NUM_NODES          -> --nnodes
#   AWS_BATCH_JOB_NODE_INDEX         -> --node_rank (main node first; c10d assigns the ranks itself)
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
# set (and the main node's) from CHECKPOINT_URI/<lineage>/ into CHECKPOINT_DIR (default
# /tmp/checkpoints) first, so that a retried attempt (same job id) resumes, and appends RESUME_ARGS
# to the script's arguments when anything was restored. The lineage is CHECKPOINT_LINEAGE (1 to 128
# letters, digits, '-' or '_'; anything else exits 2), else the job id: the capacity fallback
# resubmits a job under a new id with the original's lineage, so the successor resumes from its
# newest complete set. While the script runs, every node uploads its new complete files every
# CHECKPOINT_SYNC_SECONDS (default 60; CHECKPOINT_SYNC_MINUTES is still honoured), complete meaning
# renamed into place, or closed and unchanged for CHECKPOINT_SETTLE_SECONDS (default 30). A SIGTERM
# goes to torchrun at once and starts the last uploads while the workers exit; the last upload
# retries for CHECKPOINT_FINAL_SECONDS (default 120) while S3 throttles or errs. checkpoint_sync.py
# (beside this file) does the copying, with CHECKPOINT_PYTHON (default: PYTHON, else python3).
# Cold start, on ECS (ECS_CONTAINER_METADATA_URI_V4 set): cold_start.py (beside this file, run with
# COLD_START_PYTHON, default: PYTHON, else python3) prints one embedded-metric JSON line per node
# with the image pull, container-to-launcher, preflight and rendezvous seconds.
# Node faults (node_fault.py beside this file, run with NODE_FAULT_PYTHON, default PREFLIGHT_PYTHON,
# else python3), on multi-node runs: a child that fails its preflight or exits before its rendezvous, or
# whose trainer dies on a hardware fault, tells the main node on NODE_REPORT_PORT (default
# MASTER_PORT + 1), where the main node listens from its start, before its own preflight; the main node
# stops its preflight or training and exits 75 (78 for a fault the fleet shares) with the child's line,
# within seconds. A faulty child reports before it writes its take-out marker. A child that cannot report
# (its container killed, its image never pulled, its host lost) is seen by node_watch.py (beside this file,
# run with NODE_WATCH_PYTHON, default PYTHON, else python3; it needs boto3), which the main node starts
# with the listener on Batch (AWS_BATCH_JQ_NAME set): every NODE_WATCH_SECONDS (default 15; 0: off) it
# asks Batch's DescribeJobs for the child node jobs (<job id>#<n>, the job role's batch:DescribeJobs) and
# ends the main node the same way, 75 with "node N: Batch says FAILED: <reason>, exit code C"; when this
# node's own trainer fails first, it asks every second through the report grace. After a failed trainer,
# a node that shows a hardware fault (an NVIDIA Xid its host recorded, or its devices failing the
# preflight's checks) exits 75 instead of the trainer's status; an application error keeps it (1 stays
# 1, not retried). A node fault (preflight 75
# or hardware) leaves a take-out marker in NODE_STATE_DIR (default /var/lib/training-node) for its host.
# The preflight fails a node whose host recorded a GPU-reset Xid since boot; a node stopped by SIGTERM
# (Batch stops the others when the main node ends) reads the Xid record before it exits, and leaves the
# marker when it shows one.
# Hangs (progress_watch.py and hang_evidence.py beside this file; the relay runs like node_fault.py, the
# watch with CHECKPOINT_PYTHON's interpreter for boto3), on Batch with HANG_SECONDS > 0 (the job definitions set 300):
# the trainer's output passes through the relay, TRAINING_HEARTBEAT_FILE (PROGRESS_DIR/heartbeat, default
# /tmp/training-progress) names the file the script may touch each step, and a node whose progress (the
# heartbeat, else output) is older than HANG_SECONDS or twice its slowest step dumps its ranks' stacks
# (py-spy) and flight-recorder files (TORCH_FR_DUMP_TEMP_FILE) to CHECKPOINT_URI's prefix
# evidence/attempt-<AWS_BATCH_JOB_ATTEMPT>/node-<index>/ and tells the main node; once every node hangs, the
# main node exits with one line naming the rank and node that stopped first: 75 on the first attempt or
# with a hardware sign, HANG_EXIT (124, not retried) after.
# Workdir (workdir_fetch.py beside this file): with WORKDIR_URI, every node unpacks the job's code into WORKDIR_DIR
# (default /tmp/workdir) after its preflight and runs the script from there; WORKDIR_SETUP runs first.
# Exits with the training command's status (1 if it succeeded but the last upload failed).
set -euo pipefail
launcher_start="${EPOCHREALTIME:-$(date +%s)}"
# A stop (SIGTERM) before training starts is remembered: as the container's PID 1, bash would
# otherwise ignore it, and the node would start training only to be SIGKILLed later.
stop_requested=0
trap 'stop_requested=1' TERM INT
# A child's report reached the main node's listener (node_fault.py) before training started.
fault_reported=0
trap 'fault_reported=1' USR1

readonly NAME="distributed_run.sh"
# A failed preflight (preflight.py PREFLIGHT_EXIT): the one exit code the job definitions retry.
readonly PREFLIGHT_EXIT=75
# The fleet's AMI or image cannot train on this GPU (preflight.py IMAGE_EXIT): not retried.
readonly IMAGE_EXIT=78
readonly NODE_FAULT_EXIT=75
# A hang seen again after its retry (progress_watch.py HANG_EXIT): not retried.
readonly HANG_EXIT=124
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
readonly HERE

die() {
  last_error="$*"
  echo "$NAME: $*" >&2
  exit 2
}

# The stdlib helpers (node_fault.py, progress_watch.py relay), like the preflight.
stdlib_helper() {
  local python="${NODE_FAULT_PYTHON:-${PREFLIGHT_PYTHON:-}}"
  [[ -n "$python" ]] || python=$(command -v python3 || echo "${PYTHON:-python3}")
  local helper="$1"
  shift
  "$python" "$HERE/$helper" "$@"
}
node_fault() {
  stdlib_helper node_fault.py "$@"
}

# A child tells the main node, once, why it fails (retrying for report_seconds).
tell_main() {
  told_main=1
  node_fault report --address "$report_to" --port "$report_port" --code "$1" --job "$job_id" --within "$report_seconds" \
    --line "node $index ($(hostname)): $2" >&2 || true
}

# EXIT trap: a child tells the main node why it exits before training; the main node's listener goes.
# shellcheck disable=SC2329 # called by the EXIT trap
on_exit() {
  local status=$?
  [[ -z "${listener:-}" ]] || kill "$listener" 2>/dev/null || true
  [[ -z "${watcher:-}" ]] || kill "$watcher" 2>/dev/null || true
  if [[ "$status" -ne 0 && -n "${report_to:-}" && "${training_started:-0}" -eq 0 && "${told_main:-0}" -eq 0 ]]; then
    tell_main "$status" "${last_error:-launcher exited $status before the rendezvous}"
  fi
}

# Ends the main node for a child's report (node_fault.py listen wrote it): 75, or 78 for a shared fault.
exit_for_report() {
  local code line
  read -r code line <"$faults/report"
  # A child's bad input (2) or fleet-wide fault (78) is the job's too, and no retry mends it.
  case "$code" in
    2 | "$IMAGE_EXIT" | "$HANG_EXIT")
      echo "$NAME: $line; ending this job with exit $code (not retried)" >&2
      exit "$code"
      ;;
  esac
  echo "$NAME: $line; ending this job with exit $NODE_FAULT_EXIT so that Batch retries it on other nodes" >&2
  exit "$NODE_FAULT_EXIT"
}
reported() {
  [[ -n "${faults:-}" && -s "$faults/report" ]]
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
  local python="${PREFLIGHT_PYTHON:-}" output status errors checking
  # Stdlib only: a plain python3 starts fastest; Isaac Sim's python.sh where there is none.
  if [[ -z "$python" ]]; then
    python=$(command -v python3 || echo "${PYTHON:-python3}")
  fi
  errors=$(mktemp)
  output=$(mktemp)
  # In the background, in its own process group where setsid exists (a background job of a shell without
  # job control is no group leader, so setsid does not fork): a child's report (SIGUSR1 from the
  # listener) interrupts the wait, and the main node ends at once with the tools the checks still run.
  if command -v setsid >/dev/null 2>&1; then
    setsid "$python" "$HERE/preflight.py" >"$output" 2>"$errors" &
  else
    "$python" "$HERE/preflight.py" >"$output" 2>"$errors" &
  fi
  checking=$!
  while true; do
    status=0
    wait "$checking" || status=$?
    if [[ "$fault_reported" -ne 0 ]] && reported; then
      kill -TERM -- "-$checking" 2>/dev/null || kill -TERM "$checking" 2>/dev/null || true
      rm -f "$errors" "$output"
      exit_for_report
    fi
    kill -0 "$checking" 2>/dev/null || break
  done
  cat "$errors" >&2
  last_error=$(grep -v '^$' "$errors" | tail -n 1 || true)
  # Only its own line counts: an interpreter's wrapper may print more.
  socket_interface=$(sed -n 's/^socket_interface=//p' "$output" | tail -n 1)
  rm -f "$errors" "$output"
  # preflight.py printed the line: a failed check, or (2) a malformed variable. The caller exits, a
  # child after telling the main node.
  if [[ "$status" -eq "$PREFLIGHT_EXIT" || "$status" -eq "$IMAGE_EXIT" || "$status" -eq 2 ]]; then
    preflight_failed=$status
    return
  fi
  [[ "$status" -eq 0 ]] || die "preflight.py could not check this node (exit $status, see above)"
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
hang_seconds="${HANG_SECONDS:-0}"
is_uint "$hang_seconds" || die "HANG_SECONDS='$hang_seconds' is not a whole number of seconds (0 turns the hang watch off)"
if [[ -n "${CHECKPOINT_URI:-}" ]]; then
  if [[ -z "${CHECKPOINT_SYNC_SECONDS:-}" && -n "${CHECKPOINT_SYNC_MINUTES:-}" ]]; then
    positive CHECKPOINT_SYNC_MINUTES "$CHECKPOINT_SYNC_MINUTES"
    CHECKPOINT_SYNC_SECONDS=$(awk -v m="$CHECKPOINT_SYNC_MINUTES" 'BEGIN {print m * 60}')
  fi
  sync_seconds="${CHECKPOINT_SYNC_SECONDS:-60}"
  settle_seconds="${CHECKPOINT_SETTLE_SECONDS:-30}"
  # How long the last upload keeps retrying while S3 throttles (503 SlowDown) or errs.
  final_seconds="${CHECKPOINT_FINAL_SECONDS:-120}"
  positive CHECKPOINT_SYNC_SECONDS "$sync_seconds"
  [[ "$final_seconds" =~ ^[0-9]*\.?[0-9]+$ ]] || die "CHECKPOINT_FINAL_SECONDS='$final_seconds' is not a number of seconds (0 or more)"
  [[ "$settle_seconds" =~ ^[0-9]*\.?[0-9]+$ ]] || die "CHECKPOINT_SETTLE_SECONDS='$settle_seconds' is not a number of seconds (0 or more)"
fi
if [[ -z "${PYTHON:-}" ]] && command -v torchrun >/dev/null 2>&1; then
  runner=(torchrun)
else
  runner=("${PYTHON:-python3}" -m torch.distributed.run)
fi

job_id="${AWS_BATCH_JOB_ID:-local}"
job_id="${job_id%%#*}"
# The training lineage: the job id, or the one the capacity fallback's resubmitter carries over.
lineage="${CHECKPOINT_LINEAGE:-$job_id}"
if [[ -n "${CHECKPOINT_LINEAGE:-}" && ! "$lineage" =~ ^[A-Za-z0-9_-]{1,128}$ ]]; then
  printf -v shown '%q' "$lineage" # one line, whatever it holds
  die "CHECKPOINT_LINEAGE=${shown:0:80} is not a lineage id: 1 to 128 letters, digits, '-' or '_'"
fi
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
  report_port="${NODE_REPORT_PORT:-$((port + 1))}"
  # How long a child keeps trying to reach the main node's listener (it starts with the main node's
  # launcher; Batch starts the children only once the main node runs).
  report_seconds="${NODE_REPORT_SECONDS:-60}"
  is_uint "$report_seconds" || die "NODE_REPORT_SECONDS='$report_seconds' is not a number of seconds (0 or more)"
  is_uint "$report_port" && [[ "$report_port" -ge 1 && "$report_port" -le 65535 && "$report_port" -ne "$port" ]] ||
    die "NODE_REPORT_PORT='$report_port' is not a port number (1..65535) other than MASTER_PORT; set NODE_REPORT_PORT"

  # The main node hosts the rendezvous, whatever its Batch index. --node_rank counts from it, but the c10d
  # rendezvous assigns ranks over its sorted node descriptors (address, pid): rank 0 may be a child
  # (torch/distributed/elastic/rendezvous/dynamic_rendezvous.py), so trainctl check reads every node.
  node_rank=$(((index - main + nodes) % nodes))
  if [[ "$index" -eq "$main" ]]; then
    is_main=1
    address="${MASTER_ADDR:-$(own_address)}"
  else
    is_main=0
    address="${MASTER_ADDR:-${AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS:-}}"
    [[ -n "$address" ]] || die "child node $index has neither MASTER_ADDR nor AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"
    report_to="$address"
  fi
  trap on_exit EXIT
  if [[ "$is_main" -eq 1 && "$nodes" -gt 1 ]]; then
    faults=$(mktemp -d)
    # From the launcher's start, before this node's own preflight (minutes on GPU fleets): a child that
    # fails fast on a warm host reports while the main node still checks itself.
    # Its output goes to a file: it must not hold the launcher's stdout and stderr open.
    node_fault listen --port "$report_port" --pid $$ --out "$faults/report" --hangs "$faults/hangs" --job "$job_id" \
      >"$faults/listener.log" 2>&1 &
    listener=$!
    # On Batch (AWS_BATCH_JQ_NAME is set on every Batch job), a child that dies without a word (killed, image
    # never pulled, host lost) shows FAILED in its node job: node_watch.py asks every NODE_WATCH_SECONDS.
    if [[ -n "${AWS_BATCH_JQ_NAME:-}" ]]; then
      "${NODE_WATCH_PYTHON:-${PYTHON:-python3}}" "$HERE/node_watch.py" --job "$job_id" --nodes "$nodes" --main "$main" \
        --pid $$ --out "$faults/report" --hurry "$faults/trainer-failed" --since "$launcher_start" \
        --period "${NODE_WATCH_SECONDS:-15}" &
      watcher=$!
    fi
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

preflight_start="${EPOCHREALTIME:-$(date +%s)}"
preflight_failed=0
socket_interface=""
preflight
preflight_end="${EPOCHREALTIME:-$(date +%s)}"
if [[ "$batch" -eq 1 && -n "$socket_interface" ]]; then
  export NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-$socket_interface}"
  export GLOO_SOCKET_IFNAME="${GLOO_SOCKET_IFNAME:-$socket_interface}"
fi

if [[ "$preflight_failed" -ne 0 ]]; then
  # A child reports first and only then asks its host for the take-out: the host stops taking tasks and
  # powers off once the marker exists, and the main node must hear why before that.
  [[ -z "${report_to:-}" ]] || tell_main "$preflight_failed" "${last_error:-preflight exit $preflight_failed}"
  # A node fault (not a shared one, not bad input): the host takes this node out.
  if [[ "$preflight_failed" -eq "$PREFLIGHT_EXIT" ]]; then
    node_fault mark --line "preflight: ${last_error:-exit $PREFLIGHT_EXIT}" || true
  fi
  exit "$preflight_failed"
fi

# The job's code (trainctl submit --workdir, docs/workdir.md): every node unpacks WORKDIR_URI into WORKDIR_DIR,
# runs WORKDIR_SETUP, and runs the script from there; with CHECKPOINT_PYTHON's interpreter (boto3).
if [[ -n "${WORKDIR_URI:-}${WORKDIR_SETUP:-}" ]]; then
  export WORKDIR_DIR="${WORKDIR_DIR:-/tmp/workdir}"
  "${CHECKPOINT_PYTHON:-${PYTHON:-python3}}" "$HERE/workdir_fetch.py" --dir "$WORKDIR_DIR" || {
    fetch_status=$?
    last_error="workdir_fetch.py exited $fetch_status (see the line above)"
    exit "$fetch_status"
  }
  [[ -z "${WORKDIR_URI:-}" ]] || cd "$WORKDIR_DIR"
fi

script=("$@")
if [[ -n "${CHECKPOINT_URI:-}" ]]; then
  [[ "$CHECKPOINT_URI" == s3://?* ]] || die "CHECKPOINT_URI='$CHECKPOINT_URI' is not an s3:// URI"
  export CHECKPOINT_DIR="${CHECKPOINT_DIR:-/tmp/checkpoints}"
  mkdir -p "$CHECKPOINT_DIR"
  checkpoint_uri="${CHECKPOINT_URI%/}/$lineage/"
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

# A stopped node (Batch stops every other node when the main node ends) judges itself by the host's Xid
# record alone, at once: ECS allows 30 s before SIGKILL, and a GPU needing a reset must not take the next job.
judge_stopped() {
  stopped_fault=$(node_fault judge --since "${launcher_start%.*}" --settle 0 --xid-only) || stopped_fault=""
  if [[ -n "$stopped_fault" ]]; then
    echo "$NAME: node ${index:-0} ($(hostname)): stopped with a hardware fault recorded: $stopped_fault; asking the host to take this node out" >&2
  fi
}

if [[ "$stop_requested" -ne 0 ]]; then
  echo "$NAME: stopped (SIGTERM) before training started" >&2
  judge_stopped
  [[ -z "$stopped_fault" ]] || node_fault mark --line "stopped, hardware fault: $stopped_fault" || true
  exit 143
fi
if reported; then
  exit_for_report
fi
# From here on, a child's failure is judged after its trainer exits.
training_started=1
if [[ "$batch" -eq 0 && -z "${CHECKPOINT_URI:-}" ]]; then
  exec "${runner[@]}" "${args[@]}" "${script[@]}"
fi

# Train in the background: with checkpoints, checkpoint_sync.py uploads complete files meanwhile (it
# learns of a stop and of the trainer's exit status through files in $state); on a multi-node run, a
# child's report or this node's hardware decides the exit.
if [[ "$batch" -eq 1 && "$hang_seconds" -gt 0 ]]; then
  # The hang watch: the trainer's output passes through progress_watch.py relay, which stamps its time.
  progress_dir="${PROGRESS_DIR:-/tmp/training-progress}"
  mkdir -p "$progress_dir"
  rm -f "$progress_dir/heartbeat" "$progress_dir/output"
  export TRAINING_HEARTBEAT_FILE="$progress_dir/heartbeat"
  [[ -z "${TORCH_FR_DUMP_TEMP_FILE:-}" ]] || mkdir -p "$(dirname "$TORCH_FR_DUMP_TEMP_FILE")"
  [[ -n "${faults:-}" ]] || faults=$(mktemp -d)
  "${runner[@]}" "${args[@]}" "${script[@]}" > >(stdlib_helper progress_watch.py relay --fd 1 --mark "$progress_dir/output") \
    2> >(stdlib_helper progress_watch.py relay --fd 2 --mark "$progress_dir/output") &
else
  "${runner[@]}" "${args[@]}" "${script[@]}" &
fi
training=$!
# shellcheck disable=SC2329 # called by the traps below
stop_training() {
  kill -TERM "$training" 2>/dev/null || true
  if [[ -n "${state:-}" && ! -e "$state/stopping" ]]; then
    echo "$EPOCHREALTIME" >"$state/stopping"
  fi
}
trap 'stop_requested=1; stop_training' TERM INT
trap 'fault_reported=1; stop_training' USR1
# A stop or a report that came between the checks above and these traps.
[[ "$stop_requested" -eq 0 && "$fault_reported" -eq 0 ]] || stop_training
if [[ -n "${CHECKPOINT_URI:-}" ]]; then
  checkpoint_sync watch "${node_args[@]}" --pid "$training" \
    --sync-seconds "$sync_seconds" --settle-seconds "$settle_seconds" --final-seconds "$final_seconds" "$CHECKPOINT_DIR" &
  syncer=$!
fi
if [[ -n "${progress_dir:-}" ]]; then
  # Evidence beside the checkpoints: the prefix checkpoint_sync.py uses, whatever names the lineage.
  attempt="${AWS_BATCH_JOB_ATTEMPT:-1}"
  watching=(--pid "$training" --launcher $$ --dir "$progress_dir" --hang-seconds "$hang_seconds" --job "$job_id"
    --node "${index:-0}" --nodes "${nodes:-1}" --attempt "$attempt" --since "${launcher_start%.*}")
  [[ -z "${checkpoint_uri:-}" ]] || watching+=(--uri "${checkpoint_uri}evidence/attempt-$attempt/node-${index:-0}/")
  if [[ "${is_main:-1}" -eq 1 ]]; then
    watching+=(--out "$faults/report" --hangs "$faults/hangs")
  else
    watching+=(--report-to "$report_to" --report-port "$report_port" --within "$report_seconds")
  fi
  # boto3 for the upload: checkpoint_sync.py's interpreter.
  "${CHECKPOINT_PYTHON:-${PYTHON:-python3}}" "$HERE/progress_watch.py" watch "${watching[@]}" &
fi
wait_status "$training"
status=$waited
# A crash counts back from its own time, like a stop.
if [[ -n "${CHECKPOINT_URI:-}" && "$status" -ne 0 && ! -e "$state/stopping" ]]; then
  echo "$EPOCHREALTIME" >"$state/stopping"
fi
fault=""
stopped_fault=""
if [[ "$stop_requested" -ne 0 ]]; then
  judge_stopped
elif [[ "$status" -ne 0 ]]; then
  # A child's trainer may die of its fault a little after this one: its report gets a grace period.
  grace="${NODE_REPORT_GRACE_SECONDS:-15}"
  [[ -z "${watcher:-}" ]] || : >"$faults/trainer-failed"
  if [[ -n "${listener:-}" ]]; then
    for ((waited_for = 0; waited_for < grace * 5; waited_for++)); do
      reported && break
      sleep 0.2
    done
  fi
  if ! reported; then
    # XID_SETTLE_SECONDS (default 5): how long to wait for the host's Xid watcher after a crash.
    fault=$(node_fault judge --since "${launcher_start%.*}" --settle "${XID_SETTLE_SECONDS:-5}") || fault=""
    if [[ -n "$fault" ]]; then
      echo "$NAME: node ${index:-0} ($(hostname)): trainer exited $status on a hardware fault: $fault; exiting $NODE_FAULT_EXIT so that Batch retries on other nodes" >&2
      if [[ "${is_main:-1}" -eq 0 ]]; then
        node_fault report --address "$report_to" --port "$report_port" --code "$NODE_FAULT_EXIT" --job "$job_id" --within "$report_seconds" \
          --line "node $index ($(hostname)): hardware fault: $fault" >&2 || true
      fi
    fi
  fi
fi
if [[ -n "${CHECKPOINT_URI:-}" ]]; then
  echo "$status" >"$state/status.tmp" && mv "$state/status.tmp" "$state/status"
  wait_status "$syncer"
  synced=$waited
  rm -rf "$state"
  if [[ "$synced" -ne 0 ]]; then
    echo "$NAME: final checkpoint upload to $checkpoint_uri FAILED; results of this attempt are only on this node" >&2
    [[ "$status" -ne 0 ]] || status=1
  fi
fi
# A report that came after this node's trainer succeeded does not undo the success.
if reported && [[ "$status" -ne 0 ]]; then
  exit_for_report
fi
if [[ -n "$fault" ]]; then
  # Last, so that the host takes the node out only once this container's exit is on its way to Batch.
  node_fault mark --line "hardware fault: $fault" || true
  exit "$NODE_FAULT_EXIT"
fi
if [[ -n "$stopped_fault" ]]; then
  # A stop keeps its status (the job ends anyway); the host still takes the node out.
  node_fault mark --line "stopped, hardware fault: $stopped_fault" || true
fi
exit "$status"
