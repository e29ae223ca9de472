"""The simulator: traces, the virtual cluster and clock, and the timelines of
``fairgate simulate`` (see fairshare/README.md)."""
