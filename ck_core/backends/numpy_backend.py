"""The numpy backend: reference execution on the CPU, the embedded default.

It runs every arch's kernels "as if": the op plugin's numpy implementation
honours the kernel's dtypes and accumulation type, not its tiles.  Nothing is
compiled, so ``Registry.build`` is instant here.
"""
from __future__ import annotations

import numpy as np

from ..hookspecs import hookimpl
from ..records import BackendSpec


def _to_numpy(x):
    if hasattr(x, "detach"):  # a torch tensor
        x = x.detach().cpu()
        if str(x.dtype) == "torch.bfloat16":
            x = x.float()
        return x.numpy()
    return np.asarray(x)


@hookimpl
def ck_register_backends():
    return [BackendSpec(
        name="numpy",
        available=lambda: (True, ""),
        can_execute=lambda arch: (True, ""),
        to_backend=np.asarray,
        to_numpy=_to_numpy,
        compile=None,
        description="NumPy reference execution on the CPU (runs any arch's kernels semantically)",
    )]
