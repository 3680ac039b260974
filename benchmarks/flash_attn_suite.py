"""Run FlashAttention's own CK test suite, unmodified, against ck_fmha.flash_attn.

    python benchmarks/flash_attn_suite.py --fa PATH [--fraction F] [--min-per-test N] [--budget-s S]
                                          [--json OUT.json] [--tests tests/test_flash_attn_ck.py]

``PATH`` is a snapshot of the Dao-AILab/flash-attention repository; it needs ``tests/test_flash_attn_ck.py``,
``tests/test_flash_attn.py`` (the helpers it imports), ``flash_attn/bert_padding.py`` and
``flash_attn/layers/rotary.py`` with what that imports (``flash_attn/layers/__init__.py``,
``flash_attn/ops/__init__.py``, ``flash_attn/ops/triton/__init__.py``, ``flash_attn/ops/triton/rotary.py``),
and ``einops`` installed.  Nothing of it is copied into this project.

How: a shim package ``flash_attn`` is written to a temporary folder put first on ``sys.path``; its public
functions are ck_fmha.flash_attn's, ``flash_attn.flash_attn_interface`` adds the two internals the helper
module imports, and every other submodule (``bert_padding``, ``layers.rotary``) resolves to the snapshot's
file.  Pytest runs in this process with a sampling plugin: of each test function's parametrizations it
keeps those whose hash of (seed, node id) ranks lowest, ``max(min_per_test, ceil(fraction * n))`` of them
(pruned as pytest generates them, so the ~400k parametrizations never become items; with ``-k``, from the
items that ``-k`` leaves; node ids with parameters, ``file::function[id]``, run as named), and runs the functions round-robin so that a ``--budget-s`` cut leaves every function sampled; tests
past the budget are reported as ``not_run``.  The JSON gives per test function: collected, selected,
passed, failed, skipped (by the test itself), not_run, and the failures' first error lines.
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

PUBLIC = ("flash_attn_func", "flash_attn_kvpacked_func", "flash_attn_qkvpacked_func", "flash_attn_varlen_func",
          "flash_attn_varlen_kvpacked_func", "flash_attn_varlen_qkvpacked_func", "flash_attn_with_kvcache")

_INIT = '''"""Shim: FlashAttention's public API from ck_fmha.flash_attn; other submodules from the snapshot."""
from ck_fmha.flash_attn import ({names})

__version__ = "2.8.4+ck_fmha"
__path__.append({snapshot!r})
'''

_INTERFACE = '''"""Shim of flash_attn.flash_attn_interface: the public functions plus the two internals that
FlashAttention's tests/test_flash_attn.py imports."""
from ck_fmha.flash_attn import ({names})

USE_TRITON_ROCM = False


def _get_block_size_n(device, head_dim, is_dropout, is_causal):
    raise NotImplementedError("_get_block_size_n describes FlashAttention's CUDA kernels' tiles; "
                              "ck_fmha.flash_attn returns no unnormalised attention matrix to re-block")
'''


def write_shim(folder: str, snapshot: str) -> str:
    """Write the shim package ``flash_attn`` under ``folder``; returns folder (to put first on sys.path)."""
    pkg = os.path.join(folder, "flash_attn")
    os.makedirs(pkg, exist_ok=True)
    names = ", ".join(PUBLIC)
    with open(os.path.join(pkg, "__init__.py"), "w") as f:
        f.write(_INIT.format(names=names, snapshot=os.path.join(os.path.abspath(snapshot), "flash_attn")))
    with open(os.path.join(pkg, "flash_attn_interface.py"), "w") as f:
        f.write(_INTERFACE.format(names=names))
    return folder


def _rank(seed: int, nodeid: str) -> str:
    return hashlib.sha256(f"{seed}:{nodeid}".encode()).hexdigest()


def function_of(nodeid: str) -> str:
    return nodeid.split("::")[-1].split("[")[0]


class Sampler:
    """Pytest plugin: deterministic per-function sample, round-robin order, time budget, outcome tally."""

    def __init__(self, fraction: float, min_per_test: int, seed: int, budget_s: float):
        self.fraction, self.min_per_test, self.seed, self.budget_s = fraction, min_per_test, seed, budget_s
        self.collected = defaultdict(int)
        self.selected = defaultdict(int)
        self.pruned = set()
        self.seen = []
        self.counts = defaultdict(lambda: defaultdict(int))
        self.failures = []
        self.outcomes = {}          # short node id -> outcome (and seconds), in run order
        self.on_progress = None     # called after each test: the report survives a hard timeout
        self.t0 = None
        self.explicit = False       # the run names parametrized node ids: pytest must see them all

    def _sample(self, nodeids):
        """Indices of the nodes kept: the ``max(min_per_test, ceil(fraction * n))`` lowest ranks."""
        n = min(len(nodeids), max(self.min_per_test, math.ceil(self.fraction * len(nodeids))))
        return sorted(range(len(nodeids)), key=lambda i: _rank(self.seed, nodeids[i]))[:n]

    @pytest.hookimpl(hookwrapper=True)
    def pytest_generate_tests(self, metafunc):
        # Sample the parametrizations before pytest makes items of them: the suite has ~400k, and
        # making them all takes minutes.  With -k the sample is taken after -k, from the items.
        yield
        calls = getattr(metafunc, "_calls", None)
        if (metafunc.config.option.keyword or self.explicit or not calls
                or not all(hasattr(c, "id") for c in calls)):
            return
        fn = metafunc.function.__name__
        ids = [f"{metafunc.definition.nodeid}[{c.id}]" for c in calls]
        keep = sorted(self._sample(ids))
        self.collected[fn] = len(calls)
        self.selected[fn] = len(keep)
        self.pruned.add(fn)
        metafunc._calls = [calls[i] for i in keep]

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, session, config, items):
        by_fn = defaultdict(list)
        for it in items:
            by_fn[function_of(it.nodeid)].append(it)
        keep_lists = []
        self.seen = list(by_fn)       # functions the run selected (file::function narrows them)
        for fn, its in by_fn.items():
            if fn in self.pruned:
                chosen = sorted(its, key=lambda it: _rank(self.seed, it.nodeid))
            else:
                self.collected[fn] = len(its)
                chosen = sorted((its[i] for i in self._sample([it.nodeid for it in its])),
                                key=lambda it: _rank(self.seed, it.nodeid))
                self.selected[fn] = len(chosen)
            keep_lists.append(chosen)
        order = []
        for i in range(max((len(x) for x in keep_lists), default=0)):
            order.extend(x[i] for x in keep_lists if i < len(x))
        kept = set(id(it) for it in order)
        config.hook.pytest_deselected(items=[it for it in items if id(it) not in kept])
        items[:] = order

    def pytest_runtest_setup(self, item):
        if self.t0 is None:
            self.t0 = time.monotonic()
        if time.monotonic() - self.t0 > self.budget_s:
            item.user_properties.append(("not_run", True))
            pytest.skip("flash_attn_suite: time budget spent")

    def pytest_runtest_logreport(self, report):
        fn = function_of(report.nodeid)
        c = self.counts[fn]
        not_run = any(k == "not_run" for k, _ in report.user_properties)
        short = report.nodeid.split("::")[-1]
        if report.when == "setup":
            if report.skipped:
                c["not_run" if not_run else "skipped"] += 1
                self.outcomes[short] = "not_run" if not_run else "skipped"
            elif report.failed:
                c["failed"] += 1
                self.outcomes[short] = "failed (setup)"
                self._fail(report)
        elif report.when == "call":
            outcome = "passed" if report.passed else ("skipped" if report.skipped else "failed")
            c[outcome] += 1
            self.outcomes[short] = f"{outcome} {report.duration:.1f}s"
            if outcome == "failed":
                self._fail(report)
        elif report.when == "teardown" and self.on_progress is not None:
            self.on_progress()

    def _fail(self, report):
        text = str(report.longrepr) if report.longrepr is not None else ""
        lines = [ln for ln in text.splitlines() if ln.startswith("E ")]
        self.failures.append({"test": report.nodeid.split("::")[-1], "when": report.when,
                              "error": " | ".join(ln[1:].strip() for ln in lines[:3])[:400] or text[-400:]})

    def summary(self):
        out = {}
        for fn in self.seen:
            c = self.counts.get(fn, {})
            out[fn] = {"collected": self.collected[fn], "selected": self.selected[fn],
                       **{k: c.get(k, 0) for k in ("passed", "failed", "skipped", "not_run")}}
        return out


def _device() -> str:
    try:
        import torch

        if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
            return torch.cuda.get_device_name()
    except Exception:  # pragma: no cover - reporting only
        pass
    return "cpu (Triton interpreter)" if os.environ.get("TRITON_INTERPRET") == "1" else "cpu"


def _snapshot_commit(snapshot: str):
    try:
        return subprocess.run(["git", "-C", snapshot, "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip() or None
    except Exception:
        return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fa", required=True, help="path of a Dao-AILab/flash-attention snapshot")
    ap.add_argument("--tests", action="append", default=None,
                    help="test file inside the snapshot, file::function or file::function[id] "
                         "(repeatable; default "
                         "tests/test_flash_attn_ck.py)")
    ap.add_argument("--fraction", type=float, default=0.001, help="fraction of each function's parametrizations")
    ap.add_argument("--min-per-test", type=int, default=4, help="at least this many per test function")
    ap.add_argument("--seed", type=int, default=0, help="sampling seed (the hash of seed and node id ranks)")
    ap.add_argument("--budget-s", type=float, default=300.0, help="stop starting tests after this many seconds")
    ap.add_argument("-k", default=None, help="pytest -k expression applied before sampling")
    ap.add_argument("--fa-commit", default=None, help="the snapshot's commit, when it is not a git checkout")
    ap.add_argument("--json", default=None, help="write the report here (also printed)")
    args = ap.parse_args(argv)
    snapshot = os.path.abspath(args.fa)
    args.tests = args.tests or ["tests/test_flash_attn_ck.py"]
    targets = [os.path.join(snapshot, t) for t in args.tests]
    test_file = targets[0].split("::")[0]
    for t in targets:
        if not os.path.isfile(t.split("::")[0]):
            ap.error(f"{t.split('::')[0]} does not exist: --fa must name a flash-attention snapshot with it")
    shim = write_shim(tempfile.mkdtemp(prefix="ck_fa_shim_"), snapshot)
    sys.path.insert(0, shim)
    for p in (os.path.join(ROOT, "plugins", "fmha"), ROOT):
        if p not in sys.path:
            sys.path.append(p)
    tests_dir = os.path.dirname(test_file)
    sys.path.insert(1, tests_dir)        # test_flash_attn_ck.py imports its helper module test_flash_attn
    # pytest must not pick up the configuration or conftest.py of a project the snapshot sits in
    # (this project's set TRITON_INTERPRET=1 and --import-mode=importlib): an empty ini, conftest
    # files only from the snapshot's tests folder
    ini = os.path.join(shim, "pytest.ini")
    with open(ini, "w") as f:
        f.write("[pytest]\n")
    sampler = Sampler(args.fraction, args.min_per_test, args.seed, args.budget_s)
    sampler.explicit = any("[" in t for t in args.tests)
    pytest_args = [*targets, "-q", "-c", ini, "--rootdir", tests_dir, "--confcutdir", tests_dir,
                   "--import-mode=prepend", "-p", "no:cacheprovider", "-o", "console_output_style=classic",
                   "--tb=short", "-W", "ignore::DeprecationWarning"]
    if args.k:
        pytest_args += ["-k", args.k]
    t0 = time.time()
    command = "python benchmarks/flash_attn_suite.py " + " ".join(argv if argv is not None else sys.argv[1:])
    commit = args.fa_commit or _snapshot_commit(snapshot)

    def report(rc):
        per_test = sampler.summary()
        totals = {k: sum(v[k] for v in per_test.values())
                  for k in ("collected", "selected", "passed", "failed", "skipped", "not_run")}
        return {
            "command": command, "device": _device(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "flash_attention_snapshot": commit, "test_file": args.tests, "fraction": args.fraction,
            "min_per_test": args.min_per_test, "seed": args.seed, "budget_s": args.budget_s,
            "wall_s": round(time.time() - t0, 1), "pytest_exit_code": rc, "finished": rc is not None,
            "totals": totals, "per_test": per_test, "failures": sampler.failures, "tests": sampler.outcomes,
        }

    def write(rep):
        from ck_core.bench import with_header

        text = json.dumps(with_header(rep), indent=1)
        if args.json:
            from pathlib import Path

            from ck_core.cache import atomic_write

            os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
            atomic_write(Path(args.json), (text + "\n").encode(), prefix=".flash_attn_suite-")
        return text

    sampler.on_progress = lambda: write(report(None))
    rc = int(pytest.main(pytest_args, plugins=[sampler]))
    rep = report(rc)
    totals = rep["totals"]
    text = write(rep)
    print(text)
    return 0 if totals["failed"] == 0 and rc in (0, 1, 5) else 1


if __name__ == "__main__":
    sys.exit(main())
