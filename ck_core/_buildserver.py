"""Imported by the build pool's fork server: do the per-process start-up work once,
before the workers fork, so each worker starts compiling at once.

* the plugins (entry points scanned, op/arch/backend modules imported);
* Triton's compiler modules and its per-process, cached facts: ``triton_key()`` hashes
  Triton's sources and shared library (~0.3 s), ``get_ptxas_version`` runs ``ptxas``;
* one render (no compile) of the key in ``CK_BUILD_WARM_KEY`` (JSON, set by the build
  for the first pool of a process): imports the op's templates and fills its caches.

Nothing here starts threads or touches a GPU, so forking afterwards is safe.
"""
try:
    from .plugins import get_manager

    get_manager()
except Exception:  # pragma: no cover - an optimisation only; workers load plugins themselves
    pass

try:
    import triton.compiler.compiler  # noqa: F401
    from triton.runtime.cache import triton_key

    triton_key()
except Exception:  # pragma: no cover - triton missing or its internals moved
    pass

for _mod, _warm in (("triton.backends.nvidia.compiler", lambda m: m.get_ptxas_version(90)),
                    ("triton.backends.amd.compiler", None)):
    try:
        import importlib

        _m = importlib.import_module(_mod)
        if _warm is not None:
            _warm(_m)
    except Exception:  # pragma: no cover - no such backend / toolchain here
        pass

try:
    import json as _json
    import os as _os

    _warm_key = _os.environ.get("CK_BUILD_WARM_KEY")
    if _warm_key:
        from .key import KernelKey

        _k = KernelKey.from_dict(_json.loads(_warm_key), manager=get_manager())
        _op = get_manager().op(_k.op)
        if _op.render is not None:
            _op.render(_k, _k.backend)
except Exception:  # pragma: no cover - an optimisation only
    pass
