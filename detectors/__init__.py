"""klwatch: catch silent bugs at checkpoint/resume boundaries of RL post-training runs.

The importable core. Data flows one way:
sources (``detectors.sources``) -> runs (``Segment``) -> lineages with boundaries
(``detectors.stitching``, ``detectors.boundaries``) -> verdicts (``detectors.reference_reset`` and
``detectors.findings``) -> reports, dashboard, alerts (``detectors.report``, ``dashboard/``,
``detectors.alerts``).
"""

__version__ = "0.1.0"


def __getattr__(name: str):
    """``from detectors import assert_no_reference_reset`` without importing the CLI stack up front."""
    if name == "assert_no_reference_reset":
        from .ci import assert_no_reference_reset

        return assert_no_reference_reset
    raise AttributeError(f"module 'detectors' has no attribute {name!r}")
