"""Adapters that plug ck-fmha into other libraries (each imports its library lazily)."""
