"""The numpy launcher: runs the key it is given (its tile), chooses nothing.

Like a GPU kernel it reads ``block_cols`` columns a step and accumulates the sum of squares in
float32, ``block_rows`` rows a program; an unpadded key refuses a row length it cannot step over.
"""
from __future__ import annotations

import numpy as np

from ck_core.dtypes import numpy_storage, quantize
from ck_core.errors import UnsupportedProblem


def launcher(key):
    rows_per_program, step, pad = key.algorithm.block_rows, key.algorithm.block_cols, key.algorithm.pad

    def run(problem, tensors: dict) -> dict:
        x = np.asarray(tensors["x"]).astype(np.float32)
        w = np.asarray(tensors["w"]).astype(np.float32)
        if problem.cols % step and not pad:
            raise UnsupportedProblem(f"{key.name} cannot run cols={problem.cols}")
        y = np.empty_like(x)
        for r0 in range(0, problem.rows, rows_per_program):            # one program
            xs = x[r0:r0 + rows_per_program]
            acc = np.zeros(xs.shape[0], np.float32)
            for c0 in range(0, problem.cols, step):                       # one step (masked at the end)
                chunk = xs[:, c0:c0 + step]
                acc += np.sum(chunk * chunk, axis=1, dtype=np.float32)
            inv = 1.0 / np.sqrt(acc / np.float32(problem.cols) + np.float32(problem.eps))
            y[r0:r0 + rows_per_program] = xs * inv[:, None] * w
        out = quantize(y, problem.dtype)
        return {"y": out.astype(numpy_storage(problem.dtype), copy=False)}

    return run
