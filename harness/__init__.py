"""Differential correctness harness for attention kernels."""
from harness import _moved

_moved.install()     # an adapter of an older contract still imports its names (_moved.py)
