"""The one shape every klwatch detector has (ruptures-style): configured once, every parameter an
explicit keyword in a frozen config dataclass, then run on judged data; it never raises on odd data.

``ReferenceResetDetector`` (the headline check) judges a lineage's boundaries; each ``FindingDetector``
adds its findings to a judged lineage. Keeping configuration apart from computation lets the CLI, the
dashboard and tests set and pin the thresholds in one place.
"""

from __future__ import annotations

from typing import ClassVar, Generic, TypeVar

C = TypeVar("C")


class Detector(Generic[C]):
    """A named detector with its config (``config_class()`` when none is given)."""

    name: ClassVar[str]
    config_class: ClassVar[type]

    def __init__(self, *, config: C | None = None) -> None:
        self.config: C = config if config is not None else self.config_class()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(config={self.config!r})"
