"""fairgate cost: GPU-time, chargeback and preemption figures from the audit log.

:mod:`cost.billing` is the pure accounting engine (records in, :class:`Bill` out);
:mod:`cost.report` is the ``fairgate report`` command (verify, bill, print).
"""

from cost.billing import Bill, BillRow, Usage, bill

__all__ = ["Bill", "BillRow", "Usage", "bill"]
