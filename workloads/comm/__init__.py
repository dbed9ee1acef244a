"""The collective benchmark (`make bench-comm`): its collectives and the torchrun job."""
