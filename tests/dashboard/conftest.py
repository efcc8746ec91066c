"""``tests/`` is on sys.path, so ``import dashboard`` could find this folder (as a namespace package)
before the app's package: put the repository first, so it always means ``dashboard/``."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if sys.path[:1] != [str(REPO)]:
    sys.path.insert(0, str(REPO))
