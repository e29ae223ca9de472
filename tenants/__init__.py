"""fairgate tenants."""
