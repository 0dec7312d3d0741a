"""`budgetproxy view`: one HTML page per episode, read from trajectory logs."""
