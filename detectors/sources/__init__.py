"""Readers: turn a SOURCE (SPEC.md "Sources") into Segments.

``read_source(spec)`` is the single entry point; it never raises for bad input: every file or run
that cannot be read becomes a ``SourceError`` naming it, and the rest is read. Readers only read:
nothing here writes to a tracker or a store.
"""

from __future__ import annotations

from ..model import SourceError, SourceRead
from ..redact import redact_spec
from ..source_names import split_pattern  # noqa: F401 - the readers' home of it, re-exported
from .limits import Budget, LimitExceeded, ReadLimits, reading


def read_source(spec: str, *, limits: ReadLimits = ReadLimits()) -> SourceRead:
    """Read one SOURCE (local path, ``wandb://``, ``mlflow://``; the ``#PATTERN`` already removed),
    within ``limits``: its bytes and wall time are bounded as a whole, whatever it holds."""
    with reading(Budget(limits, what=redact_spec(spec))):  # its messages name the SOURCE, never its credentials
        try:
            if spec.startswith("wandb://"):
                from .wandb_api import read_wandb_api

                return read_wandb_api(spec)
            if spec.startswith(("mlflow://", "mlflow+http://", "mlflow+https://")):
                from .mlflow_server import read_mlflow_server

                return read_mlflow_server(spec)
            from .local import read_local

            return read_local(spec)
        except LimitExceeded as exc:
            return SourceRead(spec=spec, errors=[SourceError(spec, str(exc))])
        except Exception as exc:  # a reader bug must not take the whole scan down
            return SourceRead(spec=spec, errors=[SourceError(spec, f"{type(exc).__name__}: {exc}")])
