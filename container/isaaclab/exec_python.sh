#!/usr/bin/env bash
# Build step of the Isaac Lab image: beside Isaac Sim's python.sh, write python_exec.sh, the same script
# with its final interpreter call replaced by `exec`.
#
#   exec_python.sh /workspace/isaaclab/_isaac_sim/python.sh
#
# python.sh sets up Isaac Sim's environment, then runs the interpreter as a child of its own bash
# and ends with `$python_exe "$@" $args || error_exit` (Isaac Sim 4.x and 5.0) or, from 5.1 on,
# `    $python_exe "${filtered_args[@]}" $args || error_exit` in the else branch of its --lldb-debug
# test (isaac-sim/IsaacSim, source/scripts/python/linux-x86_64/python.sh at v5.1.0 and v6.0.1). A
# SIGTERM from a job stop then reaches only that bash, which dies and leaves the interpreter
# (torchrun and its workers) running unsignalled until the container's SIGKILL, and every failure
# becomes exit 1. With `exec` the interpreter takes the shell's place: it gets the launcher's
# signals and returns its own exit status. The build fails when python.sh has no such line, or
# more than one (a new Isaac Sim release changed it): check the new script.
set -euo pipefail

source_script="$1"
target="$(dirname "$source_script")/python_exec.sh"
# Either form, indentation kept; an extended regular expression of literal $ signs.
# shellcheck disable=SC2016
readonly CALL='^([[:space:]]*)\$python_exe "(\$@|\$\{filtered_args\[@\]\})" \$args \|\| error_exit$'

if [[ "$(grep -Ec "$CALL" "$source_script")" -ne 1 ]]; then
  echo "exec_python.sh: $source_script does not end in exactly one '\$python_exe \"\$@\" \$args || error_exit' line (or its Isaac Sim 5.1 form with \${filtered_args[@]})" >&2
  exit 1
fi
sed -E "s/$CALL/\1exec \$python_exe \"\2\" \$args/" "$source_script" >"$target"
chmod 755 "$target"
echo "exec_python.sh: wrote $target"
