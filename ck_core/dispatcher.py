"""Dispatcher: pick a kernel per problem, plan the stages, launch them.

Selection order: the tuning store (measured winners) > the
``ck_rank_candidates`` hook (a plugin that answers overrides) > the learned
ranker of (op, arch, backend) (:mod:`ck_core.ranker`) > the op's own heuristic
> first fit.  Plans and
launchers are cached per problem, so a warm ``run`` costs a dict lookup plus
the kernel launch.

A new problem of a known *selection family* (``OpSpec.selection_family``: the
problem without the sizes that leave the op's pick unchanged, e.g. the next
length of a decode loop) reuses the family's pick where that key still
``supports()`` it and the tuning store names no winner of its own: one
``supports()`` call instead of a selection.  Picks of the tuning store and of a
learned ranker (whose trees split the sizes anywhere) are not reused: those
problems are selected in full.  ``selections`` counts the full
selections, ``family_hits`` the picks reused.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Optional

from . import autotune, knobs, ranker
from .errors import CompileError, InvalidProblem, MissingKernel, UnsupportedProblem
from .memory import capturing, check_fits, persistent
from .problem import Problem
from .records import Plan, Stage
from .registry import Registry

log = logging.getLogger(__name__)

#: keys whose build failure this process has logged (a warning once per key)
_WARNED: set = set()
#: the compiler's own exceptions that mean "this kernel cannot be built or loaded here" (Triton's,
#: matched by name so that the core need not import the compiler)
_BUILD_FAILURES = ("OutOfResources", "CompilationError")


def build_failure(exc: BaseException) -> bool:
    """Whether ``exc`` says a kernel could not be compiled or loaded (so another key may run):
    :class:`CompileError` or the compiler's out-of-resources / compilation errors."""
    if isinstance(exc, CompileError):
        return True
    return any(c.__name__ in _BUILD_FAILURES and c.__module__.split(".")[0] == "triton"
               for c in type(exc).__mro__)


def size_bucket(n):
    """Where a size falls on a geometric grid of 8 steps per octave, for ``OpSpec.selection_family``:
    sizes in (m * 2**j, (m + 1) * 2**j] for m in 8..15 share a bucket, except that a power of two is a
    bucket of its own (below 17 each size is one).  So a rule ``n <= 2**k`` or ``n >= 2**k`` (a tuned
    table's length bucket, a minimum of rows) and a tile's multiple ``m * 2**j`` (``ceil(n / tile)``)
    never split a bucket; a ranking that reads the size continuously (a padded tile's waste, a learned
    ranker's log-length) can still change inside one, by the op's accepting."""
    if n is None:
        return None
    n = int(n)
    if n <= 16 or not n & (n - 1):
        return n
    m = n - 1
    b = m.bit_length()
    return (b, m >> (b - 4))


class Dispatcher:
    def __init__(self, registry: Registry, backend: Optional[str] = None, tuning=None,
                 check_backend: bool = True):
        self.registry = registry
        self.mgr = registry.mgr
        self.backend = backend or knobs.get("CK_BACKEND") or "numpy"
        self.backend_spec = self.mgr.backend(self.backend)
        self.arch = self.mgr.arch(registry.arch)
        self.tuning = tuning
        self._plans: dict[Any, Plan] = {}
        self._hot: dict[Any, tuple] = {}
        self._impls: dict[Any, Any] = {}
        self._selected: dict[Any, Any] = {}
        #: selection family (OpSpec.selection_family) -> the key a full selection picked for it
        self._families: dict[Any, Any] = {}
        self.selections = 0    # full selections (a new problem of no known family)
        self.family_hits = 0   # new problems that took their family's pick
        self._rankers: dict[str, Any] = {}
        #: key name -> why it could not be built or loaded here (the Dispatcher falls back past it)
        self.failed: dict[str, str] = {}
        self._selecting, self._tuned_for = False, None   # see _tuned_name
        self._observed = bool(self.mgr.hook.ck_after_run.get_hookimpls())
        self._sample = None  # one tiny tensor of the backend: where its tensors live, their type
        if check_backend:
            ok, why = self.backend_spec.can_execute(self.arch)
            if not ok:
                raise UnsupportedProblem(
                    f"backend {self.backend!r} cannot run {self.arch.name} kernels here: {why}"
                )

    # -- selection -----------------------------------------------------------
    def rank(self, problem) -> list:
        """Candidates for ``problem``, best first (every candidate: for tools; :meth:`select`
        usually needs only the op's shortlist)."""
        cands = self.registry.candidates(problem, backend=self.backend)
        if not cands:
            why = self.registry.why_not(problem)
            detail = ("; e.g. " + " | ".join(why)) if why else ""
            raise MissingKernel(
                f"no kernel in registry {self.registry.name!r} ({len(self.registry)} kernels, "
                f"backend {self.backend}) supports {problem}{detail}. Add kernels for this case "
                f"(Registry.from_enumeration or `ck list`), or use another arch/backend"
            )
        if self.tuning is not None:
            best = self._tuned_name(problem)
            if best:
                for k in cands:
                    if k.name == best:
                        self._rule = "tuning table"
                        return [k] + [c for c in cands if c is not k]
        ranked = self.mgr.hook.ck_rank_candidates(problem=problem, candidates=list(cands), arch=self.arch)
        if ranked:
            self._rule = "ck_rank_candidates hook"
            return list(ranked)
        op = self.mgr.op(problem.op)
        model = self.ranker(op)
        if model is not None and model.scope == "all":
            ranked = ranker.rank(model, op, problem, list(cands), self.arch)
            if ranked is not None:   # None: outside the ranker's training domain
                self._rule = f"{op.name} learned ranker ({model.kind})"
                return ranked
        short = self._shortlist(problem, op)
        if short:   # the shortlist first, so that rank(p)[0] is what select(p) picks
            first = set(short)
            cands = [c for c in cands if c not in first]
            ranked = self._rank_shortlist(problem, op, short)
            if ranked is not None:
                return ranked + (op.heuristic(problem, cands, self.arch) if op.heuristic and cands else cands)
        if op.heuristic is not None:
            self._rule = f"{op.name} heuristic"
            return [k for part in (short, cands) if part for k in op.heuristic(problem, part, self.arch)]
        self._rule = "first fit"
        return short + cands

    def _shortlist(self, problem, op) -> list:
        """The op's first picks for ``problem`` that the registry holds and that support it:
        those of the first of the op's tiers that has any."""
        if op.shortlist is None:
            return []
        for tier in op.shortlist(problem, self.arch, self.backend):
            short = self.registry.shortlist(problem, tier, self.backend)
            if short:
                return short
        return []

    def _rank_shortlist(self, problem, op, short: list):
        """``short`` ordered by a ranker that ranks shortlists (None: no such ranker, or the
        problem lies outside its training domain)."""
        model = self.ranker(op)
        if model is None or model.scope != "shortlist":
            return None
        ranked = ranker.rank(model, op, problem, short, self.arch)
        if ranked is not None:
            self._rule = f"{op.name} learned ranker ({model.kind}, shortlist)"
        return ranked

    def _quick(self, problem):
        """The pick, when the tuning table or the op's shortlist gives it without listing every
        candidate (the cost of a new problem); None sends selection to :meth:`rank`."""
        op = self.mgr.op(problem.op)
        if self.tuning is not None:
            best = self._tuned_name(problem)
            if best:
                try:
                    key = self.registry.get(best)
                except MissingKernel:
                    key = None
                if key is not None and key.backend == self.backend and op.supports(key, problem) is None:
                    self._rule, self._considered = "tuning table", "the tuned candidate"
                    return key
                # a tuned name that is no candidate here is passed over, as rank() does
        model = self.ranker(op)
        if (op.shortlist is None or self.mgr.hook.ck_rank_candidates.get_hookimpls()
                or (model is not None and model.scope == "all") or knobs.get("CK_AUTOTUNE")):
            return None   # the hook, a learned ranker of every candidate and autotuning rank them all
        short = self._shortlist(problem, op)
        if not short:
            return None
        ranked = self._rank_shortlist(problem, op, short)
        if ranked is not None:
            self._considered = f"{len(short)} shortlisted candidates"
            return ranked[0]
        self._rule, self._considered = f"{op.name} heuristic", f"{len(short)} shortlisted candidates"
        return op.heuristic(problem, short, self.arch)[0] if op.heuristic is not None else short[0]

    def _tuned_name(self, problem):
        """The tuning store's kernel name for ``problem`` (or None); inside one :meth:`select`,
        :meth:`_quick` and :meth:`rank` ask once."""
        memo = self._tuned_for
        if memo is not None and memo[0] is problem:
            return memo[1]
        best = self.tuning.lookup(self.arch.name, self.backend, problem)
        if self._selecting:
            self._tuned_for = (problem, best)
        return best

    def ranker(self, op):
        """The learned ranker for ``op`` (an OpSpec) on this arch and backend, or None; looked up once."""
        try:
            return self._rankers[op.name]
        except KeyError:
            model = self._rankers[op.name] = ranker.model_for(op, self.arch.name, self.backend)
            return model

    def _family(self, problem, op):
        """``problem``'s selection family (see the module's docstring), or None where every problem is
        selected in full: the op has none, a ``ck_rank_candidates`` hook or autotuning ranks each one."""
        if op.selection_family is None or knobs.get("CK_AUTOTUNE") \
                or self.mgr.hook.ck_rank_candidates.get_hookimpls():
            return None
        return op.selection_family(problem, self.arch, self.backend)

    def _family_pick(self, problem, op, fam):
        """The family's pick for ``problem`` where it still holds (it supports the problem, did not
        fail to build, and the tuning store has no winner for the problem), else None."""
        key = self._families.get(fam)
        if key is None or key.name in self.failed or op.supports(key, problem) is not None:
            return None
        if self.tuning is not None and self.tuning.lookup(self.arch.name, self.backend, problem):
            return None
        return key

    def select(self, problem):
        try:
            return self._selected[problem]
        except KeyError:
            pass
        op = self.mgr.op(problem.op)
        fam = self._family(problem, op)
        if fam is not None:
            key = self._family_pick(problem, op, fam)
            if key is not None:
                self._selected[problem] = key
                self.family_hits += 1
                log.debug("selected %s for %s: the pick of its selection family", key.name, problem)
                return key
        self.selections += 1
        self._selecting = True
        try:
            key = self._quick(problem)
            if key is None:
                ranked = self.rank(problem)
                self._tuned_for = None
                self._considered = f"{len(ranked)} candidates"
                if self._rule != "tuning table" and knobs.get("CK_AUTOTUNE"):
                    ranked = autotune.first_call(self, problem, ranked)
                    self._rule += ", then autotuned"
                key = ranked[0]
                if log.isEnabledFor(logging.DEBUG):
                    log.debug("for %s; runners-up: %s", problem, ", ".join(k.name for k in ranked[1:4]) or "none")
        finally:
            self._selecting, self._tuned_for = False, None
        if self.failed and key.name in self.failed:
            key = self._next_buildable(problem)
        self._selected[problem] = key
        rule = getattr(self, "_rule", "")
        if fam is not None and not rule.startswith("tuning table") and "learned ranker" not in rule:
            # (a tuned winner is the problem's own; a learned ranker's trees split sizes anywhere)
            self._families[fam] = key
        log.info("selected %s by %s from %s (registry %s)", key.name, getattr(self, "_rule", "?"),
                 getattr(self, "_considered", "?"), self.registry.name)
        return key

    def _next_buildable(self, problem):
        """The best-ranked candidate of ``problem`` that has not failed to build; CompileError
        naming the keys tried (and why each failed) when none is left."""
        ranked = self.rank(problem)
        for k in ranked:
            if k.name not in self.failed:
                self._rule = getattr(self, "_rule", "?") + ", past keys that failed to build"
                return k
        tried = "; ".join(f"{k.name}: {self.failed[k.name]}" for k in ranked)
        raise CompileError(f"no kernel for {problem} could be built or loaded on {self.arch.name}; "
                           f"tried {len(ranked)}: {tried}. Check the compiler install (and that the "
                           f"arch plugin's limits match the device), or report the failing keys")

    def _failed_build(self, problem, key, exc) -> None:
        """Remember that ``key`` failed to build (logged once per key) and forget every cached
        choice of it, so the next :meth:`run` of ``problem`` re-plans with the next candidate.

        Not while a CUDA graph is being captured: a kernel compiled or loaded inside a capture fails
        for the capture's sake (and another candidate would compile inside it too), so the key is not
        marked failed and the caller is told to run the call once before capturing."""
        why = f"{type(exc).__name__}: {str(exc)[:300]}"
        if capturing():
            raise UnsupportedProblem(
                f"kernel {key.name} could not be built or loaded while a CUDA graph was being captured ({why}); "
                f"it is not marked failed. Run this call once before capturing (kernels compile and load "
                f"outside a capture, which then records their launches)") from exc
        self.failed[key.name] = why
        if key.name not in _WARNED:
            _WARNED.add(key.name)
            log.warning("kernel %s could not be built or loaded (%s); falling back to the next candidate",
                        key.name, why)
        self._hot.pop(problem, None)
        self._plans = {p: pl for p, pl in self._plans.items() if all(st.key != key for st in pl.stages)}
        self._hot = {p: h for p, h in self._hot.items() if all(st.key != key for st in h[0].stages)}
        self._selected = {p: k for p, k in self._selected.items() if k != key}
        self._families = {f: k for f, k in self._families.items() if k != key}
        self._impls.pop(key, None)

    def plan(self, problem) -> Plan:
        try:
            return self._plans[problem]
        except KeyError:
            pass
        op = self.mgr.op(problem.op)
        if op.bytes_moved is not None:
            working = op.working_bytes(problem, self.backend) if op.working_bytes is not None else 0.0
            check_fits(problem, op.bytes_moved(problem), self.sample(), self.backend, working=working)
        steps = op.plan(problem) if op.plan else [(op.name, problem)]
        plan = Plan(problem, [Stage(name, sub, self.select(sub)) for name, sub in steps])
        self._plans[problem] = plan
        log.info("plan: %d stage(s): %s", len(plan.stages), ", ".join(st.name for st in plan.stages))
        return plan

    # -- launch ----------------------------------------------------------------
    def impl(self, key):
        try:
            return self._impls[key]
        except KeyError:
            op = self.mgr.op(key.op)
            fn = op.implement(key, self.backend, self.arch)
            self._impls[key] = fn
            return fn

    def sample(self):
        if self._sample is None:
            import numpy as np

            # kept for good: no CUDA graph's (a first call inside a graph's warm-up would leave it in the pool)
            self._sample = persistent(lambda: self.backend_spec.to_backend(np.zeros(1, np.float32)))
        return self._sample

    def check_tensors(self, problem, tensors: dict) -> None:
        """InvalidProblem for a tensor that is unknown, missing, or not the backend's type.

        Run on the first call per problem and when a launch fails, never on the warm path.
        """
        op = self.mgr.op(problem.op)
        unknown = [k for k in tensors if k not in op.input_names and k not in op.output_names]
        if unknown:
            raise InvalidProblem(f"unknown tensor name(s) {', '.join(map(repr, unknown))} for {problem.op}; "
                                 f"its inputs are {', '.join(op.input_names)} (and outputs "
                                 f"{', '.join(op.output_names)} as preallocated buffers)")
        need = problem.input_names() if isinstance(problem, Problem) else None
        if need is not None:
            missing = [k for k in need if k not in tensors]
            unused = [k for k in tensors if k not in need and k not in op.output_names
                      and tensors[k] is not None]
            if missing or unused:
                what = (f"missing input tensor(s) {', '.join(map(repr, missing))}" if missing else
                        f"tensor(s) {', '.join(map(repr, unused))} not read by this problem")
                raise InvalidProblem(f"{what}: this {problem.op} problem takes {', '.join(need)} "
                                     f"(by name where the order differs); got {', '.join(tensors) or 'none'}")
        want = type(self.sample())
        for k, t in tensors.items():
            if t is not None and not isinstance(t, want):
                raise InvalidProblem(
                    f"tensor {k!r} is a {type(t).__module__}.{type(t).__qualname__}; backend "
                    f"{self.backend!r} takes {want.__module__}.{want.__qualname__} (convert it with "
                    f"Dispatcher.backend_spec.to_backend(x))")

    def bind(self, problem, args, named) -> dict:
        op = self.mgr.op(problem.op)
        if len(args) > len(op.input_names):
            raise InvalidProblem(f"{op.name} takes at most {len(op.input_names)} positional "
                                 f"tensors ({', '.join(op.input_names)}), got {len(args)}")
        tensors = dict(zip(op.input_names, args))
        for k, v in named.items():
            if k in tensors:
                raise InvalidProblem(f"tensor {k!r} given twice (positionally and by name)")
            tensors[k] = v
        return tensors

    def run(self, problem, *args, **named):
        """Launch the plan for ``problem``; returns the op's outputs (one or a tuple).

        The hot path: after the first call for a problem, this is a few dict
        lookups plus the launches (plans and launchers are cached).
        """
        t0 = time.perf_counter() if self._observed else 0.0
        try:
            plan, runners, outputs, inputs, known, launched = self._hot[problem]
        except KeyError:
            plan = self.plan(problem)
            op = self.mgr.op(problem.op)
            runners = tuple((self.impl(s.key), s.problem) for s in plan.stages)
            outputs, inputs = op.output_names, op.input_names
            launched = tuple(s.key.name for s in plan.stages)
            known = frozenset(inputs + outputs)
            cold = True
        else:
            cold = False
        if len(args) > len(inputs):
            return self.run_dict(problem, self.bind(problem, args, named))  # raises the clear error
        tensors = dict(zip(inputs, args))
        if named:
            if not tensors.keys().isdisjoint(named):
                self.bind(problem, args, named)  # raises the clear "given twice" error
            if not named.keys() <= known:
                self.check_tensors(problem, named)  # names the unknown keyword
            tensors.update(named)
        if cold:
            self.check_tensors(problem, tensors)
            self._hot[problem] = (plan, runners, outputs, inputs, known, launched)
        i = 0
        try:
            for fn, sub in runners:
                tensors.update(fn(sub, tensors))
                i += 1
        except KeyError as e:
            self.check_tensors(problem, {k: v for k, v in tensors.items() if k in known})
            name = e.args[0] if e.args else None
            if name in inputs and tensors.get(name) is None:   # an input the plan reads was not given
                raise InvalidProblem(f"missing input tensor {name!r}: this {problem.op} problem's plan reads it "
                                     f"(got {', '.join(k for k, v in tensors.items() if v is not None) or 'none'})"
                                     ) from e
            raise
        except (AttributeError, TypeError):
            self.check_tensors(problem, {k: v for k, v in tensors.items() if k in known})
            raise
        except Exception as exc:
            if not build_failure(exc):
                raise
            self._failed_build(problem, plan.stages[i].key, exc)
            return self.run(problem, *args, **named)   # re-planned past the failed key
        if len(outputs) == 1:
            if self._observed:
                self.mgr.hook.ck_after_run(problem=problem, plan=plan, seconds=time.perf_counter() - t0,
                                           launched=launched)
            return tensors[outputs[0]]
        result = tuple(tensors[n] for n in outputs if n in tensors)
        if self._observed:
            self.mgr.hook.ck_after_run(problem=problem, plan=plan, seconds=time.perf_counter() - t0,
                                       launched=launched)
        return result[0] if len(result) == 1 else result

    def warm(self, problem, tensors: dict, **hints):
        """A closure that launches ``problem``'s plan again on tensors like ``tensors``, or None.

        For the public APIs' warm-call cache (:mod:`ck_core.warm`): after one :meth:`run`
        of ``problem`` on ``tensors``, a one-stage plan whose launcher offers ``warm``
        (``launcher.warm(problem, tensors, **hints)``: a closure taking the input tensors
        positionally, in the op's input order) skips the Dispatcher on later calls.  The
        caller's signature must pin everything the launch reads but the data pointers.
        """
        hot = self._hot.get(problem)
        if hot is None or len(hot[1]) != 1:
            return None
        fn, sub = hot[1][0]
        make = getattr(fn, "warm", None)
        f = make(sub, tensors, **hints) if make is not None else None
        return None if f is None else self.observe(problem, f)

    def observe(self, problem, f):
        """``f`` (a closure repeating a :meth:`run` of ``problem``, such as a replay of its recorded
        launches) reported to the ``ck_after_run`` observers as that run is, where there are any."""
        hot = self._hot.get(problem)
        if not self._observed or hot is None:
            return f
        plan, launched, hook = hot[0], hot[5], self.mgr.hook.ck_after_run

        def observed(*args):   # observers see warm calls too
            t0 = time.perf_counter()
            out = f(*args)
            hook(problem=problem, plan=plan, seconds=time.perf_counter() - t0, launched=launched)
            return out

        observed.__dict__.update(getattr(f, "__dict__", {}))   # what the launcher says of its closure
        return observed

    def run_dict(self, problem, tensors: dict) -> dict:
        """Like :meth:`run` but takes and returns every tensor by name."""
        t0 = time.perf_counter()
        plan = self.plan(problem)
        self.check_tensors(problem, tensors)
        given, tensors = tensors, dict(tensors)
        for stage in plan.stages:
            try:
                tensors.update(self.impl(stage.key)(stage.problem, tensors))
            except Exception as exc:
                if not build_failure(exc):
                    raise
                self._failed_build(problem, stage.key, exc)
                return self.run_dict(problem, given)   # re-planned past the failed key
        if self._observed:
            self.mgr.hook.ck_after_run(problem=problem, plan=plan, seconds=time.perf_counter() - t0,
                                       launched=tuple(s.key.name for s in plan.stages))
        return tensors

    def clear_cache(self) -> None:
        self.failed.clear()
        self._plans.clear()
        self._hot.clear()
        self._selected.clear()
        self._families.clear()
        self._impls.clear()
