"""The fair queue's rules: the Lua operations (``scripts/``), their Python calls, the
queue's value types and the reference of its order (see README.md here)."""
