"""fairgate audit: hash-chained decision records on stdout and in a Redis Stream.

Stands alone: imports nothing from other fairgate packages.
"""

from audit.chain import (
    ADMIT,
    BUDGET,
    CAPACITY,
    CHARGE,
    DECISIONS,
    DENY,
    DISPATCH,
    GENESIS,
    OVERRUN,
    PREEMPT,
    PRICING,
    QUEUE,
    QUOTA_CHANGE,
    RECLAIM,
    RELEASE,
    START,
    AuditRecord,
    ChainHead,
    VerifyResult,
    verify,
)
from audit.log import STREAM, AuditLog, StoredRecord

__all__ = [
    "ADMIT", "BUDGET", "CAPACITY", "CHARGE", "DECISIONS", "DENY", "DISPATCH", "GENESIS", "OVERRUN",
    "PREEMPT", "PRICING", "QUEUE",
    "QUOTA_CHANGE", "RECLAIM", "RELEASE", "START", "STREAM", "AuditLog", "AuditRecord", "ChainHead",
    "StoredRecord", "VerifyResult", "verify",
]
