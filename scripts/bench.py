"""Benchmark aioloader against other ways of getting safetensors weights into memory.

The benchmark is the package ``scripts/bench/`` (its docstring says what is measured
and how); this file runs it, and is what every worker process runs too::

    python scripts/bench.py --help
    python scripts/bench.py --quick            # smoke run: 1 GiB model, 1 repetition

Run as a script, its folder ``scripts/`` is first on ``sys.path``, and there the package
``bench/`` wins over this module of the same name.
"""

from __future__ import annotations

import sys

from bench.cli import main

if __name__ == "__main__":
    sys.exit(main())
