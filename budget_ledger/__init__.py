"""The budget ledger that trainctl and the budget functions share (ledger.py), stdlib only.

A package of its own, not part of config/: the functions' Lambda asset carries ledger.py beside their
handler (training_constructs/budgets/), and trainctl ships it (pyproject.toml).
"""
