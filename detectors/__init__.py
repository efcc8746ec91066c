"""klwatch: catch silent bugs at checkpoint/resume boundaries of RL post-training runs.

The importable core. Data flows one way:
sources (``klwatch.sources``) -> runs (``Segment``) -> lineages with boundaries
(``klwatch.stitching``, ``klwatch.boundaries``) -> verdicts (``klwatch.reference_reset`` and
``klwatch.findings``) -> reports, dashboard, alerts (``klwatch.report``, ``klwatch.dashboard``,
``klwatch.alerts``).
"""

__version__ = "0.2.0"
"""The one place the version is written: pyproject.toml reads it from here (``[tool.setuptools.dynamic]``), the
package metadata and so ``klwatch --version`` from that, the report's ``tool_version`` from here. Bump it with the
CHANGELOG.md section of the release."""


def __getattr__(name: str):
    """``from klwatch import assert_no_reference_reset`` without importing the CLI stack up front."""
    if name == "assert_no_reference_reset":
        from .ci import assert_no_reference_reset

        return assert_no_reference_reset
    raise AttributeError(f"module 'klwatch' has no attribute {name!r}")
