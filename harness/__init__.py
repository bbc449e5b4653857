"""Differential correctness harness for attention kernels."""
from harness.model import moved_modules

moved_modules.install()   # an adapter of an older contract still imports its names
