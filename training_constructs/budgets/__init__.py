"""Team budgets in dollars: the ledger table, the ledger and enforcement functions (docs/budgets.md).

team_budgets.py deploys them; budget_functions.py is the functions' handlers, which run beside
budget_ledger/ledger.py in their asset."""
