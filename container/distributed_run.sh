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
# Exits with the training command's status.
set -euo pipefail

readonly NAME="distributed_run.sh"

die() {
  echo "$NAME: $*" >&2
  exit 2
}

is_uint() {
  [[ "$1" =~ ^[0-9]+$ ]]
}

count_accelerators() {
  local count
  if command -v nvidia-smi >/dev/null 2>&1; then
    count=$(nvidia-smi --list-gpus 2>/dev/null | grep -c '^GPU ' || true)
    if [[ "$count" -gt 0 ]]; then
      echo "$count"
      return
    fi
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

[[ $# -ge 1 ]] || die "usage: $NAME SCRIPT [ARGS...]"

nproc="${NPROC_PER_NODE:-$(count_accelerators)}"
is_uint "$nproc" && [[ "$nproc" -ge 1 ]] || die "NPROC_PER_NODE='$nproc' is not a positive integer"
port="${MASTER_PORT:-29500}"
is_uint "$port" && [[ "$port" -ge 1 && "$port" -le 65535 ]] || die "MASTER_PORT='$port' is not a port number (1..65535)"

if [[ -z "${PYTHON:-}" ]] && command -v torchrun >/dev/null 2>&1; then
  runner=(torchrun)
else
  runner=("${PYTHON:-python3}" -m torch.distributed.run)
fi

if [[ -z "${AWS_BATCH_JOB_NUM_NODES:-}" && -z "${AWS_BATCH_JOB_NODE_INDEX:-}" ]]; then
  args=(--standalone --nnodes=1 --nproc_per_node="$nproc")
  echo "$NAME: single node, $nproc processes: ${runner[*]} ${args[*]} $*" >&2
  exec "${runner[@]}" "${args[@]}" "$@"
fi

nodes="${AWS_BATCH_JOB_NUM_NODES:-}"
index="${AWS_BATCH_JOB_NODE_INDEX:-}"
main="${AWS_BATCH_JOB_MAIN_NODE_INDEX:-0}"
is_uint "$nodes" && [[ "$nodes" -ge 1 ]] || die "AWS_BATCH_JOB_NUM_NODES='$nodes' is not a positive integer"
is_uint "$index" || die "AWS_BATCH_JOB_NODE_INDEX='$index' is not a non-negative integer"
is_uint "$main" || die "AWS_BATCH_JOB_MAIN_NODE_INDEX='$main' is not a non-negative integer"
[[ "$index" -lt "$nodes" ]] || die "AWS_BATCH_JOB_NODE_INDEX=$index is not below AWS_BATCH_JOB_NUM_NODES=$nodes"
[[ "$main" -lt "$nodes" ]] || die "AWS_BATCH_JOB_MAIN_NODE_INDEX=$main is not below AWS_BATCH_JOB_NUM_NODES=$nodes"

# The main node hosts the rendezvous and must be rank 0, whatever its Batch index.
node_rank=$(((index - main + nodes) % nodes))
if [[ "$index" -eq "$main" ]]; then
  is_host=1
  address="${MASTER_ADDR:-$(own_address)}"
else
  is_host=0
  address="${MASTER_ADDR:-${AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS:-}}"
  [[ -n "$address" ]] || die "child node $index has neither MASTER_ADDR nor AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"
fi

job_id="${AWS_BATCH_JOB_ID:-local}"
rdzv_id="${job_id%%#*}"

args=(
  --nnodes="$nodes"
  --node_rank="$node_rank"
  --nproc_per_node="$nproc"
  --rdzv_backend=c10d
  --rdzv_endpoint="$address:$port"
  --rdzv_id="$rdzv_id"
  --rdzv_conf="is_host=$is_host"
)
echo "$NAME: node $index of $nodes (rank $node_rank, main $main), $nproc processes, rendezvous $address:$port id $rdzv_id: ${runner[*]} ${args[*]} $*" >&2
exec "${runner[@]}" "${args[@]}" "$@"
