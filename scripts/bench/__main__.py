"""``python -m scripts.bench`` (from the repository root): the same as ``scripts/bench.py``."""

from __future__ import annotations

import sys

from .cli import main

sys.exit(main())
