"""`python -m analysis`: the terminal tables and JSON of traces, runs, ops, diff, merge and project."""
