"""`python -m budgetproxy.analysis PATH...` runs `budgetproxy analyze` on its own."""

from budgetproxy.analysis.command import main

raise SystemExit(main())
