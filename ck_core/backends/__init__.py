"""Built-in backends (numpy) and shared backend helpers (triton, ck)."""
