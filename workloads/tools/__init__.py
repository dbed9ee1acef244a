"""Tools built on the launcher: scaling sweeps, DDP tuning and the GPU check."""
