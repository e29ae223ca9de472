"""Lua scripts of the fair queue (loaded by fairshare.queue.calls)."""
