"""fairgate audit."""
