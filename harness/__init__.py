"""Differential correctness harness for attention kernels."""
