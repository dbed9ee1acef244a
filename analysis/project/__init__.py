"""Scaling projection: comm benchmark runs, a training run's inputs, the model and the projection."""
