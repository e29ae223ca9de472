"""fairgate admission."""
