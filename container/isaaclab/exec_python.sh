#!/usr/bin/env bash
# Build step of the Isaac Lab image: beside Isaac Sim's python.sh, write python_exec.sh, the same script
# with its final interpreter call replaced by `exec`.
#
#   exec_python.sh /workspace/isaaclab/_isaac_sim/python.sh
#
# python.sh sets up Isaac Sim's environment, then runs the interpreter as a child of its own bash
# and ends with `$python_exe "$@" $args || error_exit`. A SIGTERM from a job stop then reaches only
# that bash, which dies and leaves the interpreter (torchrun and its workers) running unsignalled
# until the container's SIGKILL, and every failure becomes exit 1. With `exec` the interpreter takes
# the shell's place: it gets the launcher's signals and returns its own exit status. The build fails
# when python.sh has no such line (a new Isaac Sim release changed it): check the new script.
set -euo pipefail

source_script="$1"
target="$(dirname "$source_script")/python_exec.sh"
# The line as Isaac Sim 4.x writes it; an extended regular expression of literal $ signs.
# shellcheck disable=SC2016
readonly CALL='^\$python_exe "\$@" \$args \|\| error_exit$'

if [[ "$(grep -Ec "$CALL" "$source_script")" -ne 1 ]]; then
  echo "exec_python.sh: $source_script does not end in exactly one '\$python_exe \"\$@\" \$args || error_exit' line" >&2
  exit 1
fi
sed -E "s/$CALL/exec \$python_exe \"\$@\" \$args/" "$source_script" >"$target"
chmod 755 "$target"
echo "exec_python.sh: wrote $target"
