"""fairgate fairshare."""
