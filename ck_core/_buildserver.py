"""Imported by the build pool's fork server: load the plugins once, before workers fork."""
try:
    from .plugins import get_manager

    get_manager()
except Exception:  # pragma: no cover - an optimisation only; workers load plugins themselves
    pass
