"""``python -m matrix_cli``: the same as the ``grace-matrix`` command."""

from __future__ import annotations

import sys

from matrix_cli.main import main

if __name__ == "__main__":
    sys.exit(main())
