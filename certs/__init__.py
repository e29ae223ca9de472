"""fairgate certs."""
