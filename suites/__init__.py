"""Workloads, the correctness suite and the performance suite (pytest based).

The suites import ``grace`` and torch lazily: a Triton-only cell runs the PTX stage checks with no
torch installed. Results leave the suites only as records (suites/records.py).
"""
