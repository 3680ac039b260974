"""The learned ranker: predicted time of each candidate kernel, evaluated with numpy alone.

A ranker is data: the ``ranker`` table of an (op, arch) tuned-data file (read
through :mod:`ck_core.tuned_data`, so it carries provenance and a user's store
can override the shipped one), keyed by backend.  Its value is a model that
maps the op's features of (problem, kernel) pairs -- ``OpSpec.features`` -- to
the log of the kernel's time relative to the best candidate.  Two kinds:

``gbdt``
    gradient-boosted regression trees, flattened into node arrays
    (``feature``, ``threshold``, ``left``, ``right``, ``value``; a leaf has
    feature -1 and points at itself; ``depth``: the most splits on a path; a row
    goes left where its feature is <= the threshold, as in LightGBM), summed over
    trees plus ``base``;
``linear``
    ``X @ coef + intercept`` over the same features (the analytic cost model
    with fitted coefficients).

A model ranks either every candidate of a problem (``candidates: "all"``, the
default) or the op's shortlist (``"shortlist"``: the keys of the op's first
shortlist tier, for ops whose key space is too large to rank per problem); the
Dispatcher asks it about that set only, the one its oracle measured.

A model may name its ``domain``: ``{feature: [lo, hi]}`` over the problem-level
features of its training shapes.  A problem outside it is not ranked (the
Dispatcher falls back to the op's heuristic): a ranker does not extrapolate.
Likewise ``kernel_domain``: ``{feature: [lo, hi]}`` over kernel-form indicators (``v_*``) that
took one value over all its training candidates (a kernel form no training shape measured); a
candidate list holding a kernel outside it is not ranked either: the model learned nothing about
that form, so its prediction for it is noise.

Training lives in :mod:`ck_core.select_train` (an optional extra); inference
here imports nothing but numpy.
"""
from __future__ import annotations

import functools
import logging
from typing import Optional, Sequence

import numpy as np

from .errors import ConfigError

log = logging.getLogger(__name__)

TABLE = "ranker"
FIELDS = ("backend",)
KINDS = ("gbdt", "linear")
#: most tree nodes a model may hold (shipped models hold tens of thousands)
MAX_NODES = 1 << 22
SCOPES = ("all", "shortlist")


class Model:
    """One fitted model: ``predict(X)`` gives each row's log relative time (lower is faster)."""

    def __init__(self, spec: dict, where: str = "ranker"):
        def bad(why):
            return ConfigError(f"{where}: {why}; regenerate it with `python -m ck_core.select_train`")

        if not isinstance(spec, dict) or spec.get("kind") not in KINDS:
            raise bad(f"model kind {spec.get('kind') if isinstance(spec, dict) else spec!r:.40} is not one "
                      f"of {KINDS}")
        names = spec.get("features")
        if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
            raise bad("'features' must be a non-empty list of feature names")
        self.kind = spec["kind"]
        self.scope = spec.get("candidates", "all")
        if self.scope not in SCOPES:
            raise bad(f"'candidates' {self.scope!r:.40} is not one of {SCOPES}")
        self.features = tuple(names)
        self.meta = {k: v for k, v in spec.items() if k not in ("trees", "coef")}
        nf = len(names)
        self.domain = _bounds(spec.get("domain"), "domain", bad)
        self.kernel_domain = _bounds(spec.get("kernel_domain"), "kernel_domain", bad)
        try:
            if self.kind == "linear":
                self.coef = np.asarray(spec["coef"], dtype=np.float64)
                self.intercept = float(spec.get("intercept", 0.0))
                if self.coef.shape != (nf,):
                    raise bad(f"'coef' has shape {self.coef.shape}, expected ({nf},)")
                if not (np.all(np.isfinite(self.coef)) and np.isfinite(self.intercept)):
                    raise bad("'coef' or 'intercept' is not a finite number")
            else:
                t = spec["trees"]
                self.base = float(spec.get("base", 0.0))
                self.feature = np.asarray(t["feature"], dtype=np.int64)
                self.threshold = np.asarray(t["threshold"], dtype=np.float64)
                self.left = np.asarray(t["left"], dtype=np.int64)
                self.right = np.asarray(t["right"], dtype=np.int64)
                self.value = np.asarray(t["value"], dtype=np.float64)
                self.roots = np.asarray(t["roots"], dtype=np.int64)
                self.depth = int(t["depth"])
                n = len(self.feature)
                if n > MAX_NODES or len(self.roots) > MAX_NODES:
                    raise bad(f"the trees hold {n} nodes, more than {MAX_NODES}")
                if not (np.all(np.isfinite(self.value)) and np.isfinite(self.base)
                        and not np.any(np.isnan(self.threshold))):
                    raise bad("a tree value or threshold is not a finite number")
                if not all(len(a) == n for a in (self.threshold, self.left, self.right, self.value)):
                    raise bad("tree node arrays differ in length")
                idx = np.concatenate([self.left, self.right, self.roots])
                if n == 0 or idx.min() < 0 or idx.max() >= n or self.feature.max() >= nf \
                        or not 0 <= self.depth <= 64:
                    raise bad("tree node indices, feature indices or depth out of range")
                # a leaf points at itself, so extra steps past its depth stay put
                self._leaf = self.feature < 0
                self._feat = np.where(self._leaf, 0, self.feature)
                # children interleaved: node 2i + 1 - (x <= threshold) picks left or right in one gather
                self._children = np.column_stack([self.left, self.right]).ravel()
                self._layout = self._sibling_layout()
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, ConfigError):
                raise
            raise bad(f"malformed model ({type(exc).__name__}: {str(exc)[:120]})") from None

    def _sibling_layout(self):
        """The trees renumbered level by level so that a node's right child is its left child + 1:
        one step of the walk is then ``node = left[node] + (x > threshold[node])``.

        Nodes a walk reaches at its last step, and leaves, get an infinite threshold and point at
        themselves, so the walk ends on the node (and value) :meth:`_walk` ends on.  Returns
        (feature, threshold, left, value, roots) or None (a leaf that does not point at itself, or a
        layout much larger than the model: shared subtrees): :meth:`_walk` evaluates those."""
        n = len(self.feature)
        if not (np.all(self.left[self._leaf] == np.flatnonzero(self._leaf))
                and np.all(self.right[self._leaf] == np.flatnonzero(self._leaf))):
            return None
        feats, thrs, lefts, olds = [], [], [], []
        cur, base = self.roots, 0
        for level in range(self.depth + 1):
            inner = ~self._leaf[cur] if level < self.depth else np.zeros(len(cur), bool)
            nxt = np.column_stack([self.left[cur[inner]], self.right[cur[inner]]]).ravel()
            start = base + len(cur)
            ids = np.arange(base, start)
            left = ids.copy()
            left[inner] = start + 2 * np.arange(int(inner.sum()))
            feats.append(np.where(inner, self._feat[cur], 0))
            thrs.append(np.where(inner, self.threshold[cur], np.inf))
            lefts.append(left)
            olds.append(cur)
            base, cur = start, nxt
            if base + len(cur) > 4 * n + 4096:
                return None
            if not len(cur):
                break
        old = np.concatenate(olds)
        return (np.concatenate(feats).astype(np.intp), np.concatenate(thrs), np.concatenate(lefts).astype(np.intp),
                self.value[old], np.arange(len(self.roots), dtype=np.intp))

    def predict(self, X: np.ndarray) -> np.ndarray:
        X = np.asarray(X, dtype=np.float64)
        if self.kind == "linear":
            return X @ self.coef + self.intercept
        if self._layout is None:
            return self._walk(X)
        feat, thr, left, value, roots = self._layout
        n, nf = X.shape
        # every (tree, row) pair walks at once: one flat gather per level
        flat = np.ascontiguousarray(X).ravel()
        node = np.repeat(roots, n)
        offset = np.tile(np.arange(n) * nf, len(roots))
        for _ in range(self.depth):
            node = left[node] + (flat[offset + feat[node]] > thr[node])
        return value[node].reshape(len(roots), n).sum(axis=0) + self.base

    def _walk(self, X: np.ndarray) -> np.ndarray:
        """:meth:`predict` over the trees' own node arrays (any model the format admits)."""
        n, nf = X.shape
        # every (tree, row) pair walks at once: one flat gather per level
        flat = np.ascontiguousarray(X).ravel()
        node = np.repeat(self.roots, n)
        offset = np.tile(np.arange(n) * nf, len(self.roots))
        for level in range(self.depth):
            go_right = flat[offset + self._feat[node]] > self.threshold[node]
            node = self._children[2 * node + go_right]
            if level % 4 == 3 and self._leaf[node].all():
                break
        return self.value[node].reshape(len(self.roots), n).sum(axis=0) + self.base


def _bounds(dom, what: str, bad) -> dict:
    """A ``{feature: [low, high]}`` domain as ``{feature: (low, high)}`` floats; ``bad`` otherwise."""
    dom = dom or {}
    if not isinstance(dom, dict):
        raise bad(f"'{what}' must map feature names to [low, high]")
    out = {}
    for name, v in dom.items():
        if not (isinstance(v, list) and len(v) == 2
                and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)):
            raise bad(f"'{what}' of {str(name)[:40]!r} must be [low, high] numbers, got {v!r:.60}")
        lo, hi = float(v[0]), float(v[1])
        if lo != lo or hi != hi or lo > hi:
            raise bad(f"'{what}' of {str(name)[:40]!r} is [{lo}, {hi}], not a range low <= high")
        out[name] = (lo, hi)
    return out


def matrix(columns: dict, names: Sequence[str], where: str) -> np.ndarray:
    """The feature matrix (candidates x features) in the model's feature order."""
    missing = [n for n in names if n not in columns]
    if missing:
        raise ConfigError(f"{where} needs feature(s) {', '.join(missing[:5])} that the op's features() no "
                          f"longer computes; retrain the ranker (python -m ck_core.select_train)")
    # one (features x candidates) array from the columns, then candidates x features
    return np.ascontiguousarray(np.array([columns[n] for n in names], dtype=np.float64).T)


@functools.lru_cache(maxsize=64)
def _model(table_obj, backend: str) -> Optional[Model]:
    spec = table_obj.get((backend,))
    if spec is None:
        return None
    return Model(spec, f"ranker in {table_obj.file_of((backend,))} for backend {backend}")


def model_for(op, arch: str, backend: str) -> Optional[Model]:
    """The shipped (or user-overridden) ranker of (op, arch, backend), or None.

    ``op`` is the OpSpec: an op without ``features`` has no ranker."""
    if getattr(op, "features", None) is None:
        return None
    from . import tuned_data

    t = tuned_data.table(op.name, arch, TABLE)
    return _model(t, backend) if len(t) else None


def predict(model: Model, op, problem, candidates: list, arch) -> np.ndarray:
    """Predicted log relative time of each candidate (lower is faster)."""
    cols = op.features(problem, candidates, arch)
    return model.predict(matrix(cols, model.features, f"the {op.name} ranker"))


def covers(model: Model, cols: dict) -> bool:
    """Whether the problem (its feature columns) lies inside the model's training domain, and
    every candidate inside its kernel domain."""
    for name, (lo, hi) in model.domain.items():
        v = cols.get(name)
        if v is None or len(v) == 0:
            return False
        if not lo - 1e-9 <= float(v[0]) <= hi + 1e-9:
            return False
    for name, (lo, hi) in model.kernel_domain.items():
        v = cols.get(name)
        if v is None or len(v) == 0:
            return False
        v = np.asarray(v, dtype=np.float64)
        if not (np.all(v >= lo - 1e-9) and np.all(v <= hi + 1e-9)):
            return False
    return True


def rank(model: Model, op, problem, candidates: list, arch) -> Optional[list]:
    """``candidates`` ordered by predicted time (ties keep registry order); None when the
    problem lies outside the model's training domain."""
    if len(candidates) < 2:
        return list(candidates)
    cols = op.features(problem, candidates, arch)
    if not covers(model, cols):
        return None
    pred = model.predict(matrix(cols, model.features, f"the {op.name} ranker"))
    return [candidates[i] for i in np.argsort(pred, kind="stable")]
