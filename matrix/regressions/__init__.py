"""Regression detection over the results store, in three layers (DESIGN.md section 5):

- ``status``: each result against its expected status (expected.toml): FAIL, IMPROVED, XFAIL, FLAKY,
  MISSING, as PyTorch's expected-accuracy files do;
- ``pairwise``: performance of a run against a baseline run, flagged only when the median ratio passes a
  threshold AND a Mann-Whitney U test on the raw samples is significant;
- ``history``: lasting steps in the nightly history, where outliers that revert are not steps.

``report.detect`` applies all three to chosen runs; thresholds come from ``matrix/thresholds.toml``.
Everything here reads the store through ``loader`` and never imports torch.
"""
