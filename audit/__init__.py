"""fairgate audit: hash-chained decision records on stdout and in a Redis Stream.

Stands alone: imports nothing from other fairgate packages.
"""

from audit.chain import (
    ADMIT,
    DECISIONS,
    DENY,
    DISPATCH,
    GENESIS,
    QUEUE,
    QUOTA_CHANGE,
    RELEASE,
    AuditRecord,
    ChainHead,
    VerifyResult,
    verify,
)
from audit.log import STREAM, AuditLog, StoredRecord

__all__ = [
    "ADMIT", "DECISIONS", "DENY", "DISPATCH", "GENESIS", "QUEUE", "QUOTA_CHANGE", "RELEASE",
    "STREAM", "AuditLog", "AuditRecord", "ChainHead", "StoredRecord", "VerifyResult", "verify",
]
