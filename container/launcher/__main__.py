"""`python3 launcher/ SCRIPT [ARGS...]`: run as a folder, this folder is the first entry of sys.path, so
the phase modules and the helpers beside this file import one another by name, as the helpers do when
they run alone (python3 launcher/node_fault.py ...).

The launcher's start time and its signal handlers come first, before any other import: as the
container's first process it would otherwise drop a SIGTERM that arrives while Python starts, and the
start time is what the Xid judge, the node watch and the cold-start line count from."""

import sys
import time

started = time.time()

from stop_signals import StopSignals  # noqa: E402 - after the clock, before the rest

signals = StopSignals()
signals.install()

from run_node import main  # noqa: E402

sys.exit(main(sys.argv[1:], signals=signals, started=started))
