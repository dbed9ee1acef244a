"""`make bench*`: benchmarks that measure every arm in one run, interleaved, and print ratios."""
