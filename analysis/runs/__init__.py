"""Run folders: typed records at the boundary, one run entry per folder, and the cross-run comparison (the runs JSON)."""
