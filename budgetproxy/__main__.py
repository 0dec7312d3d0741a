"""`python -m budgetproxy` runs the command line."""

from budgetproxy.cli import main

raise SystemExit(main())
