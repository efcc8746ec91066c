"""klwatch inside the training process: catch a reference reset at the first step after a resume.

Framework-neutral: ``record_reference`` / ``verify_reference`` (the reference's fingerprint) and
``ResumeGuard`` (that check plus the streaming KL judge and what to do on a reset). For TRL and the
Hugging Face ``Trainer``: ``klwatch.integrations.trl.guard_resumes`` (the ``trl`` extra).
"""

from .guard import (ON_RESET, REFERENCE_MATCH_METRIC, RESUME_RESET_METRIC, RESUME_SCORE_METRIC, GuardEvent,
                    ReferenceResetError, ReferenceResetWarning, ResumeGuard)
from .reference import (ReferenceCheck, ReferencePrint, ReferenceRecordError, TensorPrint, canonical_name,
                        fingerprint, load_record, record_reference, verify_reference)

__all__ = [
    "ON_RESET", "REFERENCE_MATCH_METRIC", "RESUME_RESET_METRIC", "RESUME_SCORE_METRIC", "GuardEvent",
    "ReferenceResetError", "ReferenceResetWarning", "ResumeGuard", "ReferenceCheck", "ReferencePrint",
    "ReferenceRecordError", "TensorPrint", "canonical_name", "fingerprint", "load_record", "record_reference",
    "verify_reference",
]
