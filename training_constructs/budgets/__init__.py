"""Team budgets in dollars: the ledger table, the ledger and enforcement functions (docs/budgets.md)."""
