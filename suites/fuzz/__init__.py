"""A differential fuzzer of grace against eager: random small models, random call schedules.

Problem: grace promises never to give a wrong result, yet its runtime keeps state across calls
(captured graphs, memory pools, pointer tables, decisions, moved attributes) that hand-written tests
reach only where someone thought of it. Wrong results hide at the edges real programs reach: inputs
at new addresses, views at offsets, outputs kept across calls, shape changes past the graph bound,
in-place mutation (also through ``_foreach_`` ops and slices), two threads, two streams, seeded random
ops, module attributes written behind the compiler's back.

Design: one module per job. ``models`` draws a model (as Python source) from a seed, ``schedules`` a
schedule of calls, ``execute`` runs both under eager and under ``torch.compile(backend="grace")`` in
lockstep and compares every call (``compare`` says what a difference is), ``session`` runs cases until
a deadline and counts them, ``recording`` turns the counts and failing schedules into a suite record
(workload ``fuzz``). ``settings`` loads fuzz.toml (deadlines, seed, options profiles, tolerances).
``python -m suites.fuzz --seed N --case K`` replays one case; test_fuzz_suite.py is the suite (marker
``fuzz``).

Invariants: case K of base seed N is the same model, schedule and profile everywhere; a mismatch or an
exception from grace where eager passed is a failure, never skipped; nothing here imports matrix.
"""

WORKLOAD = "fuzz"  # the workload name of the fuzz record (suites/fuzz/recording.py; the dashboard reads it)
DETAILS_FORMAT = 1  # format of the fuzz record's details; readers refuse a newer one
