"""The fleets and their money: what `status`, `check`, `cost` and `budget` read.

status: one line per fleet; compute: a fleet's queue and the compute environment behind it; capacity:
capacity waits and where a waiting job goes next; verdict: the all-reduce benchmark's result (`check`);
cost: what finished jobs cost; budget: the deployment's budgets and the ledger's spend per team.
"""
