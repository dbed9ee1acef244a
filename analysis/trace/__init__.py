"""Trace analysis: one rank's Kineto trace -> typed events -> its rank summary; a folder of ranks -> the traces JSON."""
