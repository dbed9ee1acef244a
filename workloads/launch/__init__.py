"""Launching: the launcher, supervision, heartbeats, per-rank logs and fault injection."""
