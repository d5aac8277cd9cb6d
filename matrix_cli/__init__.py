"""The ``grace-matrix`` command line, the top of the project's layers.

Dependencies point down: ``matrix_cli`` -> ``dashboards`` -> ``matrix`` -> ``suites`` -> ``grace``. The
command line is the only layer that may import all of them; nothing below imports it. Child processes
that run a command (a cell's ``run`` under ``grace-matrix nightly``) start it as ``python -m matrix_cli``.
"""
