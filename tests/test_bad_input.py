"""Bad input gets a CkError whose message says what to fix, fast (issue 12).

One table of malformed inputs: ``ck`` command lines (run in-process through
``ck_core.cli.main``), Python API calls, and config files.  Each row must end
in the expected error -- a ``CkError`` subclass, or argparse's usage error (exit
code 2) -- within ``LIMIT_S`` seconds: never a traceback, a hang or a result.
"""
from __future__ import annotations

import contextlib
import gc
import io
import json
import signal
import sys

import numpy as np
import pytest

from ck_core import errors as E
from ck_core.cli import main

pytest.importorskip("ck_gemm")
pytest.importorskip("ck_conv")

from ck_conv import ConvProblem  # noqa: E402
from ck_gemm import GemmProblem  # noqa: E402

ARCH = "gfx942"
GEMM = ["--arch", ARCH, "--dtypes", "fp16", "--layouts", "rcr"]
CONV = ["--arch", ARCH, "--directions", "forward", "--ndims", "2"]
#: CPU seconds a row may use ("fast"), and wall seconds (no hang, even on a loaded machine)
LIMIT_S = 5.0
WALL_S = 30.0


class _Slow(BaseException):
    """Raised by the timers; a BaseException so no ``except Exception`` swallows it."""


@contextlib.contextmanager
def _time_limit(seconds: float):
    """Fail a row past ``seconds`` of CPU time or ``WALL_S`` (at least 6x that) of wall time.

    The garbage collector is off inside: a full collection of what earlier tests left
    is not the row's cost.
    """
    def on_alarm(signum, frame):
        raise _Slow(f"took longer than {seconds} s of CPU time" if signum == signal.SIGPROF
                    else f"took longer than {max(WALL_S, 6 * seconds)} s of wall time (a hang?)")

    old = {sig: signal.signal(sig, on_alarm) for sig in (signal.SIGPROF, signal.SIGALRM)}
    signal.setitimer(signal.ITIMER_PROF, seconds)
    signal.setitimer(signal.ITIMER_REAL, max(WALL_S, 6 * seconds))
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.setitimer(signal.ITIMER_REAL, 0)
        for sig, handler in old.items():
            signal.signal(sig, handler)


# -- the table ------------------------------------------------------------------------------------
#
# CLI rows: (argv, rc, text): main(argv) returns or exits with ``rc`` and stderr contains ``text``.
# ``USAGE`` marks argparse's refusal (exit 2, the usage line, then "ck: error: argument ..."), ``CK``
# a CkError (rc 2, one line "ck: error: ...").

USAGE, CK = "usage", "ck"
# a CkError whose exit code is not 2 (see ck_core.errors.EXIT_CODES): no kernel (3), no device (4)
NOKERNEL, NODEVICE = "nokernel", "nodevice"
EXIT = {NOKERNEL: 3, NODEVICE: 4}




CLI_ROWS = [
    # numbers the parser itself refuses
    (["run", "gemm", "--arch", ARCH, "--repeat", "0", "--m", "8", "--n", "8", "--k", "8"], USAGE, "--repeat"),
    (["run", "gemm", "--arch", ARCH, "--repeat", "-1"], USAGE, "--repeat"),
    (["run", "gemm", "--arch", ARCH, "--repeat", "abc"], USAGE, "not a whole number"),
    (["run", "gemm", "--arch", ARCH, "--repeat", "1.5"], USAGE, "not a whole number"),
    (["run", "gemm", "--arch", ARCH, "--repeat", ""], USAGE, "--repeat"),
    (["run", "gemm", "--arch", ARCH, "--seed", "-1"], USAGE, "--seed"),
    (["run", "gemm", "--arch", ARCH, "--seed", "x"], USAGE, "--seed"),
    (["import", "/nonexistent/reg.json", "--run", "--seed", "-1"], USAGE, "--seed"),   # was an internal error
    (["build", "gemm", "--arch", ARCH, "--limit", "-1"], USAGE, "--limit"),
    (["build", "gemm", "--arch", ARCH, "--limit", "0"], USAGE, "--limit"),
    (["build", "gemm", "--arch", ARCH, "--workers", "-3"], USAGE, "--workers"),
    (["build", "gemm", "--arch", ARCH, "--workers", "0"], USAGE, "--workers"),
    (["build", "gemm", "--arch", ARCH, "--workers", "two"], USAGE, "--workers"),
    (["build", "gemm", "--arch", ARCH, "--workers", "1e3"], USAGE, "--workers"),
    (["tune", "gemm", "--arch", ARCH, "--top", "0"], USAGE, "--top"),
    (["tune", "gemm", "--arch", ARCH, "--show", "-2"], USAGE, "--show"),
    (["tune", "gemm", "--arch", ARCH, "--repeat", "0"], USAGE, "--repeat"),
    (["list", "gemm"], USAGE, "--arch"),
    (["frobnicate"], USAGE, "invalid choice"),
    (["cache", "wipe"], USAGE, "invalid choice"),
    ([], USAGE, "required"),
    # problem fields handed to the op plugin
    (["run", "gemm", "--arch", ARCH, "--m", "abc", "--n", "8", "--k", "8"], CK, "positive integer"),
    (["run", "gemm", "--arch", ARCH, "--m", "2.7", "--n", "8", "--k", "8"], CK, "positive integer"),
    (["run", "gemm", "--arch", ARCH, "--m", "0", "--n", "8", "--k", "8"], CK, "positive integer"),
    (["run", "gemm", "--arch", ARCH, "--m", "-5", "--n", "8", "--k", "8"], CK, "positive integer"),
    (["run", "gemm", "--arch", ARCH, "--m", "true", "--n", "8", "--k", "8"], CK, "positive integer"),
    (["run", "gemm", "--arch", ARCH, "--m", "8", "--n", "8", "--k", "8", "--batch", "abc"], CK, "batch"),
    (["run", "gemm", "--arch", ARCH, "--m", "8", "--n", "8", "--k", "8", "--batch", "0"], CK, "batch"),
    (["run", "gemm", "--arch", ARCH, "--n", "8", "--k", "8"], CK, "needs --m"),
    (["run", "conv", "--arch", ARCH, "--N", "1"], CK, "--input_spatial"),
    (["run", "gemm", "--arch", ARCH, "--m", "8", "--n", "8", "--k", "8", "--layout", "xyz"], CK, "layout"),
    (["run", "gemm", "--arch", ARCH, "--m", "8", "--n", "8", "--k", "8", "--dtype", "fp64"], CK, "fp64"),
    (["run", "gemm", "--arch", ARCH, "--m", "8", "--n", "8", "--k", "8", "--activation", "swish"], CK, "activation"),
    (["run", "gemm", "--arch", ARCH, "--m", "8", "--n", "8", "--k", "8", "--num_d", "9"], CK, "num_d"),
    (["run", "gemm", "--arch", ARCH, "--m", "8", "--n", "8", "--k", "8", "--d_op", "sub"], CK, "d_op"),
    (["run", "gemm", "--arch", ARCH, "--m", "8", "--n", "8", "--k", "8", "--dtype", "int8",
      "--dtype_c", "fp16"], CK, "int32"),
    (["run", "gemm", "--arch", "gfx000", "--m", "8", "--n", "8", "--k", "8"], CK, "gfx000"),
    (["run", "nosuchop", "--arch", ARCH], CK, "nosuchop"),
    (["run", "gemm", "--arch", ARCH, "--backend", "nosuch", "--m", "8", "--n", "8", "--k", "8"], CK, "nosuch"),
    (["run", "gemm", "--arch", ARCH, "--m", "8", "--n", "8", "--k", "8", "stray"], CK, "stray"),
    (["run", "gemm", *GEMM, "--m", "8", "--n", "8", "--k", "8", "--kernel-filter", "c.tile_m == 7"], NOKERNEL,
     "no kernel"),
    # problems too large for this machine: refused from their sizes, nothing allocated
    (["run", "gemm", *GEMM, "--m", "10000000", "--n", "10000000", "--k", "10000000"], NOKERNEL, "GiB"),
    (["run", "gemm", *GEMM, "--m", "65536", "--n", "65536", "--k", "65536", "--batch", "4096"], NOKERNEL, "GiB"),
    (["run", "conv", *CONV, "--N", "100000", "--C", "1024", "--K", "1024", "--input_spatial", "1024,1024",
      "--filter", "3,3"], NOKERNEL, "GiB"),
    (["tune", "gemm", *GEMM, "--m", "10000000", "--n", "10000000", "--k", "10000000"], NOKERNEL, "GiB"),
    (["run", "fmha", "--arch", ARCH, "--batch", "4096", "--nhead_q", "64", "--seqlen_q", "1000000",
      "--hdim_q", "128"], NOKERNEL, "GiB"),
    (["run", "fmha", "--arch", ARCH, "--family", "bwd_dq_dk_dv", "--batch", "64", "--nhead_q", "32",
      "--seqlen_q", "200000", "--hdim_q", "128"], NOKERNEL, "GiB"),
    # conv problems
    (["run", "conv", *CONV, "--N", "1", "--C", "4", "--K", "4", "--input_spatial", "2.7,5", "--filter", "3,3"],
     CK, "input_spatial"),
    (["run", "conv", *CONV, "--N", "1", "--C", "4", "--K", "4", "--input_spatial", "5,5", "--filter", "3,3",
      "--G", "3"], CK, "divisible"),
    (["run", "conv", *CONV, "--N", "1", "--C", "4", "--K", "4", "--input_spatial", "5,5", "--filter", "9,9"],
     CK, "output size"),
    (["run", "conv", *CONV, "--N", "1", "--C", "4", "--K", "4", "--input_spatial", "5,5", "--filter", "3,3",
      "--direction", "sideways"], CK, "direction"),
    (["run", "conv", *CONV, "--N", "1", "--C", "4", "--K", "4", "--input_spatial", "5,5", "--filter", "3,3",
      "--stride", "0"], CK, "stride"),
    (["run", "conv", *CONV, "--N", "1", "--C", "4", "--K", "4", "--input_spatial", "5,5", "--filter", "3,3",
      "--dilation", "1.5"], CK, "dilation"),
    (["run", "conv", *CONV, "--N", "1", "--C", "4", "--K", "4", "--input_spatial", "5,5", "--filter", "3,3",
      "--pad_left", "-1"], CK, "pad_left"),
    (["run", "conv", *CONV, "--N", "1", "--C", "4", "--K", "4", "--input_spatial", "5,5", "--filter", "3,3",
      "--split_k", "2"], NOKERNEL, "split_k"),
    (["run", "conv", *CONV, "--N", "abc", "--C", "4", "--K", "4", "--input_spatial", "5,5", "--filter", "3,3"],
     CK, "N must"),
    # enumeration options and filters
    (["list", "gemm", "--arch", ARCH, "--bogus", "1", "--count"], CK, "bogus"),
    (["list", "conv", "--arch", ARCH, "--directions", "sideways", "--count"], CK, "sideways"),
    (["list", "gemm", *GEMM, "--filter", "__import__('os').system('true')", "--count"], CK, ""),
    (["list", "gemm", *GEMM, "--filter", "c.tile_m ==", "--count"], CK, ""),
    (["list", "gemm", *GEMM, "--filter", "c.__class__", "--count"], CK, ""),
    (["list", "gemm", *GEMM, "--filter-file", "/nonexistent/filters.txt", "--count"], CK, "filters.txt"),
    (["list", "fmha", "--arch", "gfx950", "--receipt", "abc", "--count"], CK, "receipt"),
    (["list", "fmha", "--arch", "gfx950", "--receipt", "2.5", "--count"], CK, "receipt"),
    (["list", "fmha", "--arch", "gfx950", "--receipt", "-1", "--count"], CK, "receipt"),
    # files
    (["export", "gemm", *GEMM, "-o", "/nonexistent/folder/reg.json"], CK, "does not exist"),
    (["import", "/nonexistent/reg.json"], CK, "reg.json"),
    (["build", "gemm", *GEMM, "--json", "/nonexistent/folder/report.json"], CK, "does not exist"),
    (["export", "gemm", *GEMM, "-o", "/tmp"], CK, "is a folder"),
    # benchmarks need a GPU
    (["bench", "nosuchop"], CK, "nosuchop"),
]

if not __import__("os").path.exists("/dev/nvidia0"):
    CLI_ROWS += [(["bench", op], NODEVICE, "GPU") for op in ("gemm", "conv", "fmha")]


def _run_cli(argv):
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            rc = main(argv)
        except SystemExit as exc:
            rc = exc.code
    return rc, err.getvalue()


@pytest.mark.parametrize("argv,kind,text", CLI_ROWS, ids=[" ".join(r[0])[:60] for r in CLI_ROWS])
def test_cli_refuses(argv, kind, text, tmp_path, monkeypatch):
    monkeypatch.setenv("CK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CK_TUNING_DB", str(tmp_path / "tuning.json"))
    with _time_limit(LIMIT_S):
        rc, err = _run_cli(argv)
    assert rc == EXIT.get(kind, 2), f"rc={rc}: {err}"
    assert "Traceback" not in err
    if kind == USAGE:
        assert err.startswith("usage: ck") and "error: " in err, err
    else:
        assert err.startswith("ck: error: "), err
        assert len(err.strip().splitlines()) == 1, err
    assert text in err, err


def test_cli_accepts_receipt_by_name():
    with _time_limit(LIMIT_S * 4):  # a real enumeration: both spellings give the same set
        by_name = _run_cli_out(["list", "fmha", "--arch", "gfx950", "--receipt", "pytorch", "--count"])
        by_number = _run_cli_out(["list", "fmha", "--arch", "gfx950", "--receipt", "4", "--count"])
    assert by_name == by_number and int(by_name) > 0


def _run_cli_out(argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(argv) == 0
    return out.getvalue().strip()


# -- files ---------------------------------------------------------------------------------------

def _write(tmp_path, name, data):
    p = tmp_path / name
    if isinstance(data, bytes):
        p.write_bytes(data)
    else:
        p.write_text(data)
    return p


_RANDOM = np.random.default_rng(12).integers(0, 256, 4096, dtype=np.uint8).tobytes()
_DEEP_TOML = "a = " + "[" * 3000 + "]" * 3000
_DEEP_JSON = "[" * 100000 + "]" * 100000
_MID_JSON = json.dumps({"variant": "fwd", "trait_config": json.loads("[" * 40 + "]" * 40)})
_KSET = '[[kernel_set]]\nop = "gemm"\narch = "gfx942"\n'

# (file name, content, loader, expected error, text in the message)
FILE_ROWS = [
    ("sets.toml", _RANDOM, "kernel_sets", E.ConfigError, "sets.toml"),
    ("sets.toml", b"\x00" * 64, "kernel_sets", E.ConfigError, "binary"),
    ("sets.toml", _DEEP_TOML, "kernel_sets", E.ConfigError, "sets.toml"),
    ("sets.toml", "a = 1\nb = " + "{x = " * 40 + "1" + "}" * 40, "kernel_sets", E.ConfigError, "deeper"),
    ("sets.toml", "kernel_set = [\n", "kernel_sets", E.ConfigError, "not valid TOML"),
    ("sets.toml", "", "kernel_sets", E.ConfigError, "kernel_set"),
    ("sets.toml", "kernel_set = 3", "kernel_sets", E.ConfigError, "kernel_set"),
    ("sets.toml", "kernel_set = [1, 2]", "kernel_sets", E.ConfigError, "table"),
    ("sets.toml", "[[kernel_set]]\nop = \"gemm\"\n", "kernel_sets", E.ConfigError, "arch"),
    ("sets.toml", _KSET + "colour = \"red\"\n", "kernel_sets", E.ConfigError, "colour"),
    ("sets.toml", _KSET + "filter = 3\n", "kernel_sets", E.ConfigError, "filter"),
    ("sets.toml", _KSET + "filter = \"__import__('os')\"\n", "kernel_sets", E.ConfigError, "filter"),
    ("sets.toml", _KSET + "options = \"x\"\n", "kernel_sets", E.ConfigError, "options"),
    ("sets.toml", "\ufeff" + _KSET + "x = \u00e9\n", "kernel_sets", E.ConfigError, "sets.toml"),
    ("cfg.json", _RANDOM, "json", E.ConfigError, "cfg.json"),
    ("cfg.json", _DEEP_JSON, "json", E.ConfigError, "cfg.json"),
    ("cfg.json", "[" * 40 + "]" * 40, "json", E.ConfigError, "deeper"),
    ("cfg.json", "{", "json", E.ConfigError, "not valid JSON"),
    ("cfg.json", "{\"a\": NaN, ", "json", E.ConfigError, "cfg.json"),
    ("sweep.json", _RANDOM, "sweep", E.ConfigError, "sweep.json"),
    ("sweep.json", _DEEP_JSON, "sweep", E.ConfigError, "sweep.json"),
    ("sweep.json", _MID_JSON, "sweep", E.ConfigError, "sweep.json"),
    ("sweep.toml", _DEEP_TOML, "sweep", E.ConfigError, "sweep.toml"),
    ("sweep.toml", _RANDOM, "sweep", E.ConfigError, "sweep.toml"),
    ("filters.txt", _RANDOM, "filter_file", E.ConfigError, "filters.txt"),
    ("filters.txt", "# only a comment\n", "filter_file", E.ConfigError, "filters.txt"),
    ("filters.txt", "c.tile_m == 128\nc.tile_m ==\n", "filter_file", E.ConfigError, "filters.txt:2"),
    ("filters.txt", "(" * 3000 + "c.tile_m" + ")" * 3000 + " == 1\n", "filter_file", E.ConfigError,
     "filters.txt"),
    ("filters.txt", "c.pipeline * 300000000 == 'x'\n", "filter_file_run", E.ConfigError, "filters.txt"),
    ("reg.json", _RANDOM, "registry", E.CkError, "reg.json"),
    ("reg.json", "[]", "registry", E.CkError, "reg.json"),
    ("reg.json", _DEEP_JSON, "registry", E.CkError, "reg.json"),
    ("reg.json", "{", "registry", E.CkError, "reg.json"),
]


def _load(kind, path):
    if kind == "kernel_sets":
        from ck_core.config import load_kernel_sets
        return load_kernel_sets(path)
    if kind == "json":
        from ck_core.config import load_json
        return load_json(path)
    if kind == "sweep":
        from ck_fmha.codegen import load_sweep
        return load_sweep(path)
    if kind in ("filter_file", "filter_file_run"):
        from ck_core.filters import load_filter_file
        pred = load_filter_file(path)
        if kind == "filter_file_run":  # the cost of one evaluation must be bounded too
            from types import SimpleNamespace
            pred({"pipeline": "compv3", "tile_m": 128, "c": SimpleNamespace(pipeline="compv3")})
        return pred
    if kind == "registry":
        from ck_core.registry import Registry
        return Registry.import_json(path)
    raise AssertionError(kind)


@pytest.mark.parametrize("name,data,kind,exc,text", FILE_ROWS,
                         ids=[f"{r[2] if isinstance(r, tuple) else r.values[2]}-{i}"
                              for i, r in enumerate(FILE_ROWS)])
def test_file_refused(name, data, kind, exc, text, tmp_path):
    pytest.importorskip("ck_fmha")
    path = _write(tmp_path, name, data)
    with _time_limit(LIMIT_S), pytest.raises(exc) as info:
        _load(kind, path)
    assert text in str(info.value)


@pytest.mark.parametrize("kind", ["kernel_sets", "json", "sweep", "filter_file", "registry"])
def test_missing_or_directory_refused(kind, tmp_path):
    pytest.importorskip("ck_fmha")
    for path in (tmp_path / "absent.json", tmp_path):
        with _time_limit(LIMIT_S), pytest.raises(E.CkError):
            _load(kind, path)


# -- Python API ------------------------------------------------------------------------------------

_CONV = dict(N=1, C=4, K=4, input_spatial=(5, 5), filter=(3, 3))

PROBLEM_ROWS = [
    (GemmProblem, dict(m=2.7, n=8, k=8)),
    (GemmProblem, dict(m=True, n=8, k=8)),
    (GemmProblem, dict(m="8", n=8, k=8)),
    (GemmProblem, dict(m=None, n=8, k=8)),
    (GemmProblem, dict(m=-1, n=8, k=8)),
    (GemmProblem, dict(m=8, n=8, k=8, batch=0)),
    (GemmProblem, dict(m=8, n=8, k=8, batch=1.0)),
    (GemmProblem, dict(m=8, n=8, k=8, dtype="fp64")),
    (GemmProblem, dict(m=8, n=8, k=8, dtype=16)),
    (GemmProblem, dict(m=8, n=8, k=8, layout="xyz")),
    (GemmProblem, dict(m=8, n=8, k=8, layout=["r", "c", "r"])),
    (GemmProblem, dict(m=8, n=8, k=8, num_d=5)),
    (GemmProblem, dict(m=8, n=8, k=8, num_d=True)),
    (GemmProblem, dict(m=8, n=8, k=8, num_d=1.0)),
    (GemmProblem, dict(m=8, n=8, k=8, d_op="sub")),
    (GemmProblem, dict(m=8, n=8, k=8, activation="swish")),
    (GemmProblem, dict(m=8, n=8, k=8, dtype_c="int8")),
    (GemmProblem, dict(m=8, n=8, k=8, dtype="int8", dtype_c="fp16")),
    (ConvProblem, dict(_CONV, N=2.7)),
    (ConvProblem, dict(_CONV, N=True)),
    (ConvProblem, dict(_CONV, input_spatial=(2.7, 5))),
    (ConvProblem, dict(_CONV, input_spatial=(True, 5))),
    (ConvProblem, dict(_CONV, input_spatial=None)),
    (ConvProblem, dict(_CONV, input_spatial="55")),
    (ConvProblem, dict(_CONV, input_spatial=(5, 5, 5, 5))),
    (ConvProblem, dict(_CONV, input_spatial=())),
    (ConvProblem, dict(_CONV, filter=(3.0, 3))),
    (ConvProblem, dict(_CONV, filter=(3,))),
    (ConvProblem, dict(_CONV, stride=(0, 1))),
    (ConvProblem, dict(_CONV, stride=(1.5, 1))),
    (ConvProblem, dict(_CONV, dilation=(1, 0))),
    (ConvProblem, dict(_CONV, pad_left=(-1, 0))),
    (ConvProblem, dict(_CONV, pad_right=(0.5, 0))),
    (ConvProblem, dict(_CONV, pad_left=(1, 1, 1))),
    (ConvProblem, dict(_CONV, G=3)),
    (ConvProblem, dict(_CONV, G=2, K=5, C=4)),
    (ConvProblem, dict(_CONV, direction="sideways")),
    (ConvProblem, dict(_CONV, dtype="fp64")),
    (ConvProblem, dict(_CONV, in_layout="NCHW")),
    (ConvProblem, dict(_CONV, in_layout="NDHWGC")),
    (ConvProblem, dict(_CONV, split_k=-1, direction="bwd_weight")),
    (ConvProblem, dict(_CONV, split_k=True, direction="bwd_weight")),
    (ConvProblem, dict(_CONV, filter=(9, 9))),
]


@pytest.mark.parametrize("cls,kw", PROBLEM_ROWS, ids=[f"{c.__name__}-{i}" for i, (c, _) in enumerate(PROBLEM_ROWS)])
def test_problem_refused(cls, kw):
    with _time_limit(LIMIT_S), pytest.raises(E.InvalidProblem):
        cls(**kw)


def test_integral_sizes_of_other_types_are_accepted():
    """numpy integers are sizes too (shapes computed with numpy); they are stored as int."""
    p = GemmProblem(m=np.int64(8), n=np.int32(3), k=5, batch=np.int16(2))
    assert p == GemmProblem(m=8, n=3, k=5, batch=2) and type(p.m) is int
    c = ConvProblem(N=np.int64(1), C=4, K=4, input_spatial=np.array([5, 5]), filter=(np.int64(3), 3))
    assert c == ConvProblem(**_CONV) and type(c.input_spatial[0]) is int


_FMHA = dict(batch=2, nhead_q=2, nhead_k=2, seqlen_q=8, seqlen_k=8, hdim_q=16, hdim_v=16)


@pytest.mark.parametrize("kw", [dict(batch=2.7), dict(batch=True), dict(batch="abc")])
def test_fmha_problem_refused(kw):
    fmha = pytest.importorskip("ck_fmha.problem")
    with _time_limit(LIMIT_S), pytest.raises(E.InvalidProblem):
        fmha.FmhaProblem(**dict(_FMHA, **kw))


def test_fmha_causal_window_never_sees_future_keys():
    """A causal mask with a left window keeps window_right at 0 (no look-ahead), as documented."""
    fmha = pytest.importorskip("ck_fmha.problem")
    p = fmha.FmhaProblem(**dict(_FMHA, mask="causal", window_left=3))
    assert p.window_left == 3 and p.window_right == 0


@pytest.mark.parametrize("cls,data", [
    (GemmProblem, {"m": 8, "n": 8}),
    (GemmProblem, {"m": 8, "n": 8, "k": 8, "colour": 1}),
    (GemmProblem, {"op": "conv", "m": 8, "n": 8, "k": 8}),
    (ConvProblem, {**_CONV, "colour": 1}),
    (ConvProblem, {"N": 1}),
])
def test_problem_from_dict_refused(cls, data):
    with _time_limit(LIMIT_S), pytest.raises(E.InvalidProblem):
        cls.from_dict(data)


def _with_d(reg):
    """The plain keys plus the same keys with one D tensor (enumeration gives no epilogue keys)."""
    import attrs
    from ck_core import Registry
    keys = list(reg)[:40]
    return Registry(reg.arch, keys + [attrs.evolve(k, signature=attrs.evolve(k.signature, num_d=1))
                                      for k in keys])


@pytest.fixture(scope="module")
def gemm_numpy():
    from ck_core import Registry
    from ck_core.dispatcher import Dispatcher
    return Dispatcher(_with_d(Registry.from_enumeration("gemm", ARCH, "numpy", dtypes=["fp16"], layouts=["rcr"])),
                      backend="numpy")


@pytest.fixture(scope="module")
def gemm_triton():
    pytest.importorskip("torch")
    from ck_core import Registry
    from ck_core.backends.triton_backend import interpreting
    from ck_core.dispatcher import Dispatcher
    if not interpreting():
        pytest.skip("needs TRITON_INTERPRET=1 (set by conftest)")
    return Dispatcher(_with_d(Registry.from_enumeration("gemm", ARCH, "triton", dtypes=["fp16"], layouts=["rcr"])),
                      backend="triton")


@pytest.fixture(scope="module")
def conv_numpy():
    from ck_core import Registry
    from ck_core.dispatcher import Dispatcher
    reg = Registry.from_enumeration("conv", ARCH, "numpy", dtypes=["fp16"], ndims=[2])
    return Dispatcher(reg, backend="numpy")


def _h(*shape):
    return np.ones(shape, np.float16)


P8 = GemmProblem(m=8, n=8, k=8)
P8D = GemmProblem(m=8, n=8, k=8, num_d=1)
PCONV = ConvProblem(**_CONV)
PCONV_BD = ConvProblem(**_CONV, direction="bwd_data")

# (dispatcher fixture, problem, args, kwargs, expected, text in the message)
RUN_ROWS = [
    ("gemm_numpy", P8, (_h(8, 8),), {}, E.InvalidProblem, "'b'"),
    ("gemm_numpy", P8, (), {"a": _h(8, 8)}, E.InvalidProblem, "'b'"),
    ("gemm_numpy", P8D, (_h(8, 8), _h(8, 8)), {}, E.InvalidProblem, "'d0'"),
    ("gemm_numpy", P8, (_h(8, 8), _h(8, 8)), {"z": _h(8, 8)}, E.InvalidProblem, "'z'"),
    ("gemm_numpy", P8, (_h(8, 8), _h(8, 8)), {"bias": _h(8, 8)}, E.InvalidProblem, "a, b, d0"),
    ("gemm_numpy", P8, (_h(8, 8), _h(8, 8), _h(8, 8)), {}, E.InvalidProblem, "'d0'"),
    ("gemm_numpy", P8, (_h(8, 8).tolist(), _h(8, 8)), {}, E.InvalidProblem, "list"),
    ("gemm_numpy", P8, (_h(8, 8), 3.0), {}, E.InvalidProblem, "float"),
    ("gemm_numpy", P8, (_h(8, 8), _h(8, 8)), {"a": _h(8, 8)}, E.InvalidProblem, "twice"),
    ("gemm_numpy", P8, tuple(_h(8, 8) for _ in range(7)), {}, E.InvalidProblem, "at most"),
    ("gemm_numpy", P8, (_h(4, 8), _h(8, 8)), {}, E.InvalidProblem, "shape"),
    ("gemm_numpy", P8, (np.ones((8, 8), np.float32), _h(8, 8)), {}, E.InvalidProblem, "dtype"),
    ("gemm_numpy", GemmProblem(m=1 << 20, n=1 << 20, k=1 << 20, batch=1 << 10), (), {},
     E.UnsupportedProblem, "GiB"),
    ("gemm_triton", P8, (_h(8, 8), _h(8, 8)), {}, E.InvalidProblem, "torch.Tensor"),
    ("gemm_triton", P8, ([[1.0] * 8] * 8, [[1.0] * 8] * 8), {}, E.InvalidProblem, "list"),
    ("gemm_triton", P8, (), {"b": None}, E.InvalidProblem, "'a'"),
    ("gemm_triton", P8D, ("torch", "torch"), {}, E.InvalidProblem, "'d0'"),
    ("gemm_triton", P8, ("torch", "torch"), {"q": "torch"}, E.InvalidProblem, "'q'"),
    ("conv_numpy", PCONV, (), {"x": _h(*PCONV.input_shape)}, E.InvalidProblem, "'w'"),
    ("conv_numpy", PCONV, (_h(*PCONV.input_shape), _h(*PCONV.weight_shape)), {"y2": _h(1)},
     E.InvalidProblem, "'y2'"),
    ("conv_numpy", PCONV_BD, (_h(*PCONV.output_shape), _h(*PCONV.weight_shape)), {}, E.InvalidProblem,
     "by name"),
    ("conv_numpy", PCONV, (_h(*PCONV.input_shape).tolist(), _h(*PCONV.weight_shape)), {},
     E.InvalidProblem, "list"),
    ("conv_numpy", ConvProblem(N=1 << 14, C=1 << 10, K=1 << 10, input_spatial=(1 << 10, 1 << 10),
                               filter=(3, 3)), (), {}, E.UnsupportedProblem, "GiB"),
]


def _torchify(v):
    import torch
    return torch.ones(8, 8, dtype=torch.float16) if isinstance(v, str) and v == "torch" else v


@pytest.mark.parametrize("disp,problem,args,kw,exc,text", RUN_ROWS,
                         ids=[f"{r[0]}-{i}" for i, r in enumerate(RUN_ROWS)])
def test_run_refused(disp, problem, args, kw, exc, text, request):
    d = request.getfixturevalue(disp)
    args = tuple(_torchify(a) for a in args)
    kw = {k: _torchify(v) for k, v in kw.items()}
    for attempt in range(2):  # the first call per problem and a warm one both refuse
        with _time_limit(LIMIT_S), pytest.raises(exc) as info:
            d.run(problem, *args, **kw)
        assert text in str(info.value)


def test_warm_call_with_a_bad_tensor_is_refused(gemm_triton):
    """After a good first call the warm path checks nothing up front; a failing launch still names the cause."""
    import torch
    a = torch.ones(8, 8, dtype=torch.float16)
    gemm_triton.run(P8, a, a)
    with _time_limit(LIMIT_S), pytest.raises(E.InvalidProblem, match="list"):
        gemm_triton.run(P8, a.tolist(), a)
    with _time_limit(LIMIT_S), pytest.raises(E.InvalidProblem, match="unknown"):
        gemm_triton.run(P8, a, a, zz=a)


def test_launchers_refuse_non_tensors():
    """The plugins' direct Triton entry points (outside the Dispatcher) name the wrong operand."""
    pytest.importorskip("triton")
    from ck_conv import run as conv_run
    from ck_gemm.backends.triton.launch import gemm
    from ck_gemm.heuristics import pick_config
    torch = pytest.importorskip("torch")
    h = torch.ones(8, 8, dtype=torch.float16)
    cfg = pick_config(8, 8, 8)
    for a, b, what in ((_h(8, 8), h, "ndarray"), (h, [[1.0] * 8] * 8, "list")):
        with _time_limit(LIMIT_S), pytest.raises(E.InvalidProblem, match=what):
            gemm(a, b, config=cfg)
    with _time_limit(LIMIT_S), pytest.raises(E.InvalidProblem, match="ndarray"):
        conv_run(PCONV, {"x": _h(*PCONV.input_shape), "w": _h(*PCONV.weight_shape)})
    with _time_limit(LIMIT_S), pytest.raises(E.InvalidProblem, match="missing w"):
        conv_run(PCONV, {"x": torch.ones(PCONV.input_shape, dtype=torch.float16)})


@pytest.mark.parametrize("call", [
    lambda: __import__("ck_core").Registry.from_enumeration("nosuchop", ARCH),
    lambda: __import__("ck_core").Registry.from_enumeration("gemm", "gfx000"),
    lambda: __import__("ck_core").Registry.from_enumeration("gemm", ARCH, bogus=1),
    lambda: __import__("ck_core").Registry.from_enumeration("gemm", ARCH, dtypes=["fp64"]),
    lambda: __import__("ck_core").Registry.from_enumeration("conv", ARCH, ndims=[4]),
    lambda: __import__("ck_core").Registry.from_enumeration("gemm", ARCH, filter="c.tile_m.__class__"),
])
def test_registry_call_refused(call):
    with _time_limit(LIMIT_S), pytest.raises(E.CkError):
        call()


def test_table_is_large_enough():
    n = (len(CLI_ROWS) + len(FILE_ROWS) + len(PROBLEM_ROWS) + len(RUN_ROWS) + len(API_ROWS) + 5 + 7 + 5)
    assert n >= 100, n


if sys.platform == "win32":  # pragma: no cover
    pytest.skip("SIGALRM time limits need POSIX", allow_module_level=True)


# -- the public torch APIs (issue 25): one validation before any backend -----------------------------

def _t(*shape, dtype="float16"):
    import torch
    return torch.randn(*shape).to(getattr(torch, dtype))


def _i32(*vals):
    import torch
    return torch.tensor(vals, dtype=torch.int32)


def _fa(name):
    from ck_fmha import flash_attn
    return getattr(flash_attn, name)


def _paged(bt):
    from ck_fmha import decode
    return decode.paged_decode(_t(2, 4, 1, 64), _t(5, 8, 2, 64), _t(5, 8, 2, 64), bt, _i32(10, 10))


#: (name, call, expected CkError, text in the message)
API_ROWS = [
    ("k batch 1 for q batch 2", lambda: _fa("flash_attn_func")(_t(2, 5, 4, 32), _t(1, 7, 4, 32), _t(1, 7, 4, 32)),
     E.InvalidProblem, "batch"),
    ("v 6 keys for k 7", lambda: _fa("flash_attn_func")(_t(2, 5, 4, 32), _t(2, 7, 4, 32), _t(2, 6, 4, 32)),
     E.InvalidProblem, "key length"),
    ("alibi 3 slopes for 4 heads", lambda: _fa("flash_attn_func")(_t(1, 5, 4, 32), _t(1, 5, 4, 32), _t(1, 5, 4, 32),
                                                                  alibi_slopes=_t(3, dtype="float32")),
     E.InvalidProblem, "alibi_slopes"),
    ("varlen tokens of k and v differ", lambda: _fa("flash_attn_varlen_func")(
        _t(5, 2, 32), _t(7, 2, 32), _t(6, 2, 32), _i32(0, 5), _i32(0, 7), 5, 7), E.InvalidProblem, "tokens"),
    ("block_table past the pool", lambda: _paged(_i32(0, 1, 2, 7).view(2, 2)), E.InvalidProblem, "outside the pool"),
    ("negative block_table entry", lambda: _paged(_i32(0, -1, 2, 3).view(2, 2)), E.InvalidProblem, "outside the pool"),
    ("with_kvcache block_table past the pool", lambda: _fa("flash_attn_with_kvcache")(
        _t(2, 1, 4, 64), _t(5, 8, 2, 64), _t(5, 8, 2, 64), cache_seqlens=_i32(10, 10),
        block_table=_i32(0, 1, 2, 9).view(2, 2)), E.InvalidProblem, "outside the pool"),
    ("float cu_seqlens", lambda: _fa("flash_attn_varlen_func")(
        _t(5, 2, 32), _t(5, 2, 32), _t(5, 2, 32), _t(2, dtype="float32").abs().cumsum(0), _i32(0, 5), 5, 5),
     E.InvalidProblem, "int32"),
    ("int64 cu_seqlens", lambda: _fa("flash_attn_varlen_func")(
        _t(5, 2, 32), _t(5, 2, 32), _t(5, 2, 32), _i32(0, 5).long(), _i32(0, 5), 5, 5), E.InvalidProblem, "int32"),
    ("conv2d padding 1.7", lambda: __import__("ck_conv").conv2d(_t(1, 4, 8, 8), _t(4, 4, 3, 3), padding=(1.7, 0.2)),
     E.InvalidProblem, "not an integer"),
    ("conv2d stride 1.5", lambda: __import__("ck_conv").conv2d(_t(1, 4, 8, 8), _t(4, 4, 3, 3), stride=1.5),
     E.InvalidProblem, "not an integer"),
    ("conv1d dilation 2.0", lambda: __import__("ck_conv").conv1d(_t(1, 4, 8), _t(4, 4, 3), dilation=2.0),
     E.InvalidProblem, "not an integer"),
    ("conv3d groups 1.0", lambda: __import__("ck_conv").conv3d(_t(1, 4, 5, 5, 5), _t(4, 4, 3, 3, 3), groups=1.0),
     E.InvalidProblem, "not an integer"),
    ("conv2d stride True", lambda: __import__("ck_conv").conv2d(_t(1, 4, 8, 8), _t(4, 4, 3, 3), stride=True),
     E.InvalidProblem, "bool"),
    ("conv2d numpy input", lambda: __import__("ck_conv").conv2d(_h(1, 4, 8, 8), _t(4, 4, 3, 3)),
     E.InvalidProblem, "torch tensors"),
    ("matmul numpy b", lambda: __import__("ck_gemm").matmul(_t(4, 8), _h(8, 4)), E.InvalidProblem, "torch tensors"),
    ("matmul float d", lambda: __import__("ck_gemm").matmul(_t(4, 8), _t(8, 4), d=(3.5,)), E.InvalidProblem,
     "float"),
    ("matmul bf16 under the interpreter", lambda: __import__("ck_gemm").matmul(_t(8, 8, dtype="bfloat16"),
                                                                               _t(8, 8, dtype="bfloat16")),
     E.UnsupportedProblem, "interpreter"),
    ("attention bf16 under the interpreter", lambda: __import__("ck_fmha").attention(
        _t(1, 2, 8, 64, dtype="bfloat16"), _t(1, 2, 8, 64, dtype="bfloat16"), _t(1, 2, 8, 64, dtype="bfloat16")),
     E.UnsupportedProblem, "interpreter"),
    ("attention without v", lambda: __import__("ck_fmha").attention(_t(1, 2, 8, 64), _t(1, 2, 8, 64), None),
     E.InvalidProblem, "v is NoneType"),
]


@pytest.mark.parametrize("name,call,exc,text", API_ROWS, ids=[r[0] for r in API_ROWS])
def test_public_api_refused(name, call, exc, text):
    """Refused under the interpreter (this process); tests/test_public_api_cpu.py runs the APIs in
    the numpy mode.  The first call may enumerate a registry; the second must be fast."""
    import os

    if "interpreter" in name and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the interpreter's refusal")
    for attempt in range(2):
        with _time_limit(LIMIT_S if attempt else 60.0), pytest.raises(exc) as info:
            call()
        assert text in str(info.value), str(info.value)


@pytest.fixture(scope="module")
def fmha_dispatchers():
    from ck_core import Dispatcher, Registry
    return {be: Dispatcher(Registry.from_enumeration("fmha", ARCH, be, families=["fwd"]), backend=be)
            for be in ("numpy", "triton")}


def test_fmha_run_without_v_names_it(fmha_dispatchers):
    """A missing tensor the plan reads is an InvalidProblem naming it (was a raw KeyError)."""
    import torch
    from ck_fmha.problem import FmhaProblem
    p = FmhaProblem(batch=1, nhead_q=2, seqlen_q=8, seqlen_k=8, hdim_q=64, dtype="fp16")
    q = _h(1, 2, 8, 64)
    for be, x in (("numpy", q), ("triton", torch.from_numpy(q))):
        with _time_limit(60.0), pytest.raises(E.InvalidProblem, match="missing input tensor 'v'"):
            fmha_dispatchers[be].run(p, q=x, k=x)
    # a numpy array on the triton backend's warm path (after a good call) names the type
    fmha_dispatchers["triton"].run(p, q=torch.from_numpy(q), k=torch.from_numpy(q), v=torch.from_numpy(q))
    with _time_limit(LIMIT_S), pytest.raises(E.InvalidProblem, match="torch"):
        fmha_dispatchers["triton"].run(p, q=q, k=q, v=q)


def test_check_against_reference_of_a_bias_without_dbias():
    """A backward with a bias but no dbias validates (the reference returned dbias: KeyError 'dbias')."""
    from ck_core import Dispatcher, Registry
    from ck_core.testing import check_against_reference
    from ck_fmha.problem import FmhaProblem
    p = FmhaProblem(family="bwd_dq_dk_dv", batch=1, nhead_q=2, seqlen_q=8, seqlen_k=8, hdim_q=64, dtype="fp16",
                    bias="elementwise")
    for be in ("numpy", "triton"):
        d = Dispatcher(Registry.from_enumeration("fmha", ARCH, be, families=["bwd_dot_do_o", "bwd_dq_dk_dv",
                                                                            "bwd_convert_dq"]), backend=be)
        report = check_against_reference(d, p, np.random.default_rng(3))
        assert report.passed and "dbias" not in str(report), report


def test_group_problem_without_queries_plans():
    """Every query segment empty: plans on both spaces (features() called total_q as a method)."""
    from ck_core import Dispatcher, Registry
    from ck_fmha import features
    from ck_fmha.backends.triton import keys as tk
    from ck_core.plugins import get_manager
    from ck_fmha.problem import FmhaProblem
    p = FmhaProblem(mode="group", batch=1, nhead_q=2, hdim_q=64, dtype="fp16", seqstart_q=(0, 0),
                    seqstart_k=(0, 13))
    for be in ("numpy", "triton"):
        d = Dispatcher(Registry.from_enumeration("fmha", ARCH, be, families=["fwd"]), backend=be)
        assert d.plan(p).stages
    arch = get_manager().arch("sm90")
    keys = [k for k in tk.enumerate_keys(arch, "triton", {"families": ["fwd"], "dtypes": ["fp16"]})
            if tk.supports(k, p) is None]
    assert keys and features.features(p, keys, arch)
