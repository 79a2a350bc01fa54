"""Node health: the boot-time host check on every node, its alarm, and the fleet check on a schedule."""
