"""fairgate webhook."""
