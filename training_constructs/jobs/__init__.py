"""How jobs reach a fleet: its queue, its multi-node job definitions and the workloads they run by default."""
