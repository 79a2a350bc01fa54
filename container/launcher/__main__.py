"""`python3 launcher/ SCRIPT [ARGS...]`: run as a folder, this folder is the first entry of sys.path, so
the phase modules and the helpers beside this file import one another by name, as the helpers do when
they run alone (python3 launcher/node_fault.py ...)."""

import sys

from run_node import main

sys.exit(main(sys.argv[1:]))
