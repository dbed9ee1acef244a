"""Training: the process context, models, data, the loop and the end-of-run record."""
