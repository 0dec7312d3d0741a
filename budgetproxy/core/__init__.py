"""The pure core: episode accounting, budgets and disclosure, with no I/O."""
