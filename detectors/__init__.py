"""klwatch: catch silent bugs at checkpoint/resume boundaries of RL post-training runs.

The importable core. Data flows one way:
sources (``detectors.sources``) -> runs (``Segment``) -> lineages with boundaries
(``detectors.stitching``, ``detectors.boundaries``) -> verdicts (``detectors.reference_reset`` and
``detectors.findings``) -> reports, dashboard, alerts (``detectors.report``, ``dashboard/``,
``detectors.alerts``).
"""

__version__ = "0.1.0"
