#!/usr/bin/env bash
# Launch a PyTorch script on every node of an AWS Batch multi-node parallel (MNP) job:
#
#   distributed_run.sh train.py --flag value
#
# The launcher is the Python package in launcher/ beside this file (stdlib only, Python 3.10 or later;
# launcher/run_node.py describes its phases, launcher/ending.py its exit codes). This shim only picks
# the interpreter: python3 where there is one, else $PYTHON (Isaac Sim's python.sh); exec keeps the
# launcher the container's first process, so it receives Batch's SIGTERM itself.
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="$(command -v python3 || echo "${PYTHON:-python3}")"
exec "$python" "$here/launcher" "$@"
