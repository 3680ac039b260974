"""The CLI explains itself: per-op help, did-you-mean, fast dependency errors, -v, --csv,
FMHA receipts by name and typed masks, GEMM multi-D/split-K kernels, `ck import --run`."""
from __future__ import annotations

import csv
import io
import json
import logging
import subprocess
import sys
import textwrap
import time

import attrs
import pytest

from ck_core import get_manager
from ck_core.cli import main


@pytest.fixture(autouse=True)
def _tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CK_CACHE_DIR", str(tmp_path / "cache"))


def _main(capsys, *argv):
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("cmd", ["run", "list"])
@pytest.mark.parametrize("op", ["gemm", "conv", "fmha"])
def test_op_help_lists_every_field_and_option(capsys, cmd, op):
    spec = get_manager().op(op)
    with pytest.raises(SystemExit) as exc:
        main([cmd, op, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    fields_part, options_part = out.split("\nproblem fields", 1)[1].split("\nenumeration options", 1)
    lines = fields_part.splitlines()
    for f in attrs.fields(spec.problem_type):
        assert sum(ln.strip().startswith(f"--{f.name} ") for ln in lines) == 1, f.name
    assert spec.options, f"{op} declares no enumeration options"
    for name in spec.options:
        assert sum(ln.strip().startswith(f"--{name} ") for ln in options_part.splitlines()) == 1, name
    if cmd == "run" and op == "fmha":  # FmhaProblem.seed (dropout) vs the command's input seed
        assert any(ln.strip().startswith("--seed ") and "command's own option" in ln for ln in lines)
        assert "--dropout_seed" in out and "--window" in out


@pytest.mark.parametrize("argv, hint", [
    (["run", "gemm", "--arch", "gfx942", "--m", "8", "--n", "8", "--k", "8", "--dtyp", "fp16"], "--dtype"),
    (["list", "gemm", "--arch", "gfx942", "--layout", "rcr", "--count"], "--layouts"),
    (["list", "gemm", "--arch", "gfx924", "--count"], "gfx942"),
    (["list", "gemn", "--arch", "gfx942", "--count"], "gemm"),
    (["list", "fmha", "--arch", "gfx950", "--recipt", "0", "--count"], "--receipt"),
])
def test_unknown_names_get_a_did_you_mean(capsys, argv, hint):
    t0 = time.perf_counter()
    rc, out, err = _main(capsys, *argv)
    assert rc == 2 and "did you mean" in err and hint in err, err
    assert time.perf_counter() - t0 < 5


_NO_TRITON = textwrap.dedent("""
    import sys, time
    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("triton", "torch"):
                raise ModuleNotFoundError(name, name=name)
    sys.meta_path.insert(0, Block())
    t0 = time.perf_counter()
""")


def test_missing_triton_is_named_within_a_second():
    code = _NO_TRITON + textwrap.dedent("""
        from ck_core.cli import main
        rc = main(["list", "gemm", "--arch", "gfx942", "--backend", "triton", "--count"])
        print("rc", rc, "secs", time.perf_counter() - t0)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "rc 4" in r.stdout, r.stdout + r.stderr   # 4: a backend unavailable here
    assert "ck-core[triton]" in r.stderr
    assert float(r.stdout.split("secs")[1]) < 1.0 + 2.0  # plugin loading included; was 13 minutes


def test_gemm_enumeration_without_triton_is_fast():
    code = _NO_TRITON + textwrap.dedent("""
        from ck_core.registry import enumerate_keys
        keys = enumerate_keys("gemm", "gfx942", "triton", dtypes=["fp16"], layouts=["rcr"])
        print(len(keys), time.perf_counter() - t0)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    n, secs = r.stdout.split()
    assert int(n) > 1000 and float(secs) < 10, r.stdout  # a failed import per key took 74 s


def test_verbose_logs_selection_and_plan(capsys, caplog):
    caplog.set_level(logging.INFO, logger="ck_core.dispatcher")
    rc, out, err = _main(capsys, "-v", "run", "fmha", "--arch", "gfx942", "--family", "fwd_splitkv",
                         "--batch", "1", "--nhead_q", "2", "--seqlen_q", "3", "--seqlen_k", "70",
                         "--num_splits", "2")
    assert rc == 0
    msgs = [r.getMessage() for r in caplog.records]
    assert sum(m.startswith("selected ") and "candidates" in m for m in msgs) == 2, msgs
    assert any(m.startswith("plan: 2 stage(s)") for m in msgs), msgs


def test_vv_turns_on_debug_logging():
    """-v logs at INFO, -vv at DEBUG (a fresh process: pytest's own log handlers would swallow it)."""
    argv = ["run", "gemm", "--arch", "gfx942", "--m", "16", "--n", "16", "--k", "16", "--repeat", "1"]
    levels = []
    for flag in ("-v", "-vv"):
        r = subprocess.run([sys.executable, "-m", "ck_core", flag, *argv], capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        levels.append({ln.split()[0] for ln in r.stderr.splitlines() if ln[:1].isupper() and " " in ln})
    assert "INFO" in levels[0] and "DEBUG" not in levels[0], levels
    assert "DEBUG" in levels[1], levels


def test_run_csv_one_row_per_stage(capsys):
    rc, out, _ = _main(capsys, "run", "fmha", "--arch", "gfx942", "--family", "bwd_dq_dk_dv", "--batch", "1",
                       "--nhead_q", "2", "--seqlen_q", "17", "--seqlen_k", "17", "--csv")
    assert rc == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [r["stage"] for r in rows] == ["bwd_dot_do_o", "bwd_dq_dk_dv", "bwd_convert_dq"]
    assert all(r["passed"] == "True" and r["kernel"].startswith("fmha_bwd_") for r in rows)
    assert rows[0]["seqlen_q"] == "17"


def test_fmha_receipt_by_name_and_typed_masks(capsys):
    counts = []
    for receipt in ("2", "flash_fwd"):
        rc, out, _ = _main(capsys, "list", "fmha", "--arch", "gfx950", "--receipt", receipt, "--family", "fwd",
                           "--count")
        counts.append(int(out))
    assert counts[0] == counts[1] > 0
    rc, _, err = _main(capsys, "list", "fmha", "--arch", "gfx950", "--receipt", "flash", "--count")
    assert rc == 2 and "flash_fwd" in err
    base = ["run", "fmha", "--arch", "gfx942", "--batch", "2", "--nhead_q", "2", "--seqlen_q", "19",
            "--seqlen_k", "33", "--json"]
    got = []
    for mask in (["--mask", "b", "--window", "8,4"], ["--mask", "b:8,4"]):
        rc, out, _ = _main(capsys, *base, *mask)
        res = json.loads(out)
        assert rc == 0 and res["passed"]
        got.append({k: res["problem"][k] for k in ("mask", "window_left", "window_right")})
    assert got[0] == got[1] == {"mask": "bottom_right", "window_left": 8, "window_right": 4}


def test_gemm_multi_d_and_split_k_kernels(capsys):
    rc, out, _ = _main(capsys, "list", "gemm", "--arch", "gfx942", "--dtypes", "fp16", "--layouts", "rcr", "--count")
    base = int(out)
    rc, out, _ = _main(capsys, "list", "gemm", "--arch", "gfx942", "--dtypes", "fp16", "--layouts", "rcr",
                       "--num_ds", "0,2", "--d_ops", "add,mul", "--activations", "none,gelu", "--split_ks", "1,3",
                       "--count")
    # (no D: 1 op) + (two Ds: 2 ops) = 3 epilogues, x 2 activations, x 2 split-K factors
    assert int(out) == base * 3 * 2 * 2
    rc, out, _ = _main(capsys, "run", "gemm", "--arch", "gfx942", "--m", "67", "--n", "45", "--k", "150",
                       "--num_d", "2", "--d_op", "mul", "--activation", "gelu", "--dtypes", "fp16",
                       "--layouts", "rcr", "--num_ds", "2", "--d_ops", "mul", "--activations", "gelu",
                       "--split_ks", "3", "--json")
    res = json.loads(out)
    assert rc == 0 and res["passed"], res
    assert "_d2mul_gelu_sk3" in res["plan"][0]["kernel"]


def test_import_runs_a_problem(capsys, tmp_path):
    path = tmp_path / "reg.json"
    rc, _, _ = _main(capsys, "export", "gemm", "--arch", "gfx942", "--dtypes", "bf16", "--layouts", "rrr",
                     "--filter", "c.tile_m == 64", "-o", str(path))
    assert rc == 0
    rc, out, _ = _main(capsys, "import", str(path), "--run", "--m", "33", "--n", "71", "--k", "20",
                       "--dtype", "bf16", "--layout", "rrr", "--json")
    res = json.loads(out)
    assert rc == 0 and res["passed"] and res["plan"][0]["kernel"].startswith("gemm_bf16_rrr_")
    rc, _, err = _main(capsys, "import", str(path), "--run", "--m", "33", "--n", "71", "--kk", "20")
    assert rc == 2 and "did you mean --k" in err


def test_busy_line_only_for_slow_steps(capsys):
    from ck_core.progress import busy

    with busy("quick step", after=0.5, enabled=True):
        pass
    with busy("slow step", after=0.05, enabled=True):
        time.sleep(0.5)
    err = capsys.readouterr().err
    assert "slow step" in err and "quick step" not in err


def test_run_and_tune_name_every_slow_step(capsys, monkeypatch, tmp_path):
    """`ck run` and `ck tune` wrap each step that can take seconds (enumeration, selection, the first
    call's compile, the float64 reference, timing) in a busy line."""
    import contextlib

    from ck_core import cli

    seen = []

    @contextlib.contextmanager
    def spy(desc, **kw):
        seen.append(desc)
        yield

    monkeypatch.setattr(cli, "busy", spy)
    monkeypatch.setenv("CK_TUNED_DIR", str(tmp_path / "store"))
    rc, _, _ = _main(capsys, "run", "gemm", "--arch", "gfx942", "--m", "40", "--n", "24", "--k", "16",
                     "--dtype", "fp16", "--layout", "rcr", "--repeat", "1")
    assert rc == 0
    for word in ("enumerating", "selecting", "running", "reference", "timing"):
        assert any(d.startswith(word) or word in d for d in seen), (word, seen)
    seen.clear()
    rc, _, _ = _main(capsys, "tune", "gemm", "--arch", "gfx942", "--m", "40", "--n", "24", "--k", "16",
                     "--dtype", "fp16", "--layout", "rcr", "--top", "2", "--repeat", "1")
    assert rc == 0
    assert [d.split()[0] for d in seen] == ["enumerating", "selecting", "timing"], seen
    seen.clear()
    out = str(tmp_path / "reg.json")
    assert _main(capsys, "export", "gemm", "--arch", "gfx942", "--dtypes", "fp16", "--layouts", "rcr",
                 "--filter", "c.tile_m == 64", "-o", out)[0] == 0
    assert _main(capsys, "import", out)[0] == 0
    assert [d.split()[0] for d in seen] == ["enumerating", "filtering", "writing", "reading"], seen


# -- `ck run` enumerates only what can run the problem ---------------------------------------------

def _narrowing_cases():
    from ck_conv import ConvProblem
    from ck_fmha.problem import FmhaProblem
    from ck_gemm import GemmProblem

    rng = __import__("random").Random()
    m, n, k = (rng.randrange(1, 300) for _ in range(3))
    return [
        ("gemm", "gfx942", GemmProblem(m=m, n=n, k=k, dtype=rng.choice(["fp16", "bf16"]),
                                       layout=rng.choice(["rcr", "rrr", "crr", "ccr"]))),
        ("gemm", "sm90", GemmProblem(m=m, n=n, k=k, dtype="fp16", layout="ccr")),
        ("conv", "gfx942", ConvProblem(N=2, G=2, C=8, K=12, input_spatial=(rng.randrange(3, 20), 11),
                                       filter=(3, 3), direction=rng.choice(["forward", "bwd_data", "bwd_weight"]))),
        ("fmha", "gfx942", FmhaProblem(family="fwd_splitkv", batch=2, nhead_q=4, seqlen_q=3,
                                       seqlen_k=rng.randrange(60, 300), num_splits=3)),
        ("fmha", "gfx950", FmhaProblem(family="bwd_dq_dk_dv", batch=1, nhead_q=2, seqlen_q=40,
                                       seqlen_k=rng.randrange(40, 90), mask="top_left")),
    ]


@pytest.mark.parametrize("i", range(5))
def test_problem_options_keep_every_candidate(i):
    """The narrowed registry (ck run / ck tune / ck demo) holds every key of the whole space that can
    run each stage of the problem's plan -- so the same kernels are chosen -- and far fewer keys."""
    from ck_core import Dispatcher, Registry
    from ck_core.cli import narrowed_options

    op_name, arch, problem = _narrowing_cases()[i]
    op = get_manager().op(op_name)
    opts = narrowed_options(op, problem, {})
    assert opts, f"{op_name} declares no problem_options"
    narrow = Registry.from_enumeration(op_name, arch, "numpy", **opts)
    full = Registry.from_enumeration(op_name, arch, "numpy")
    stages = [sub for _, sub in op.plan(problem)] if op.plan else [problem]
    for sub in stages:
        want = {k.name for k in full.candidates(sub, "numpy")}
        assert want and {k.name for k in narrow.candidates(sub, "numpy")} == want, sub
    assert len(narrow) * 2 < len(full), (len(narrow), len(full))
    assert [s.key.name for s in Dispatcher(narrow).plan(problem).stages] == \
        [s.key.name for s in Dispatcher(full).plan(problem).stages]


def test_ck_run_gemm_enumerates_one_signature(capsys):
    """`ck run gemm` of a 64^3 fp16 problem enumerated the arch's 185,008 keys (6-8 s on two cores); now
    only the problem's dtype/layout/epilogue: a few thousand."""
    rc, out, err = _main(capsys, "run", "gemm", "--arch", "gfx942", "--m", "64", "--n", "64", "--k", "64",
                         "--json", "--repeat", "1")
    assert rc == 0, err
    from ck_core import Registry
    from ck_gemm import GemmProblem

    op = get_manager().op("gemm")
    p = GemmProblem(m=64, n=64, k=64)
    reg = Registry.from_enumeration("gemm", "gfx942", "numpy", **op.problem_options(p))
    assert 0 < len(reg) < 185008 // 10
    assert {k.signature for k in reg} == {next(iter(reg)).signature}
    assert json.loads(out)["candidates"] == len(reg.candidates(p, "numpy"))
    # a fused epilogue needs no enumeration flags now: the problem names it
    rc, out, err = _main(capsys, "run", "gemm", "--arch", "sm90", "--m", "33", "--n", "17", "--k", "40",
                         "--dtype", "bf16", "--num_d", "1", "--activation", "gelu", "--repeat", "1")
    assert rc == 0 and "verdict : PASS" in out and "gelu" in out, out + err


# -- optional dependencies are named with the extra that installs them, before any work ------------

def _blocked(modules, body: str) -> subprocess.CompletedProcess:
    code = textwrap.dedent(f"""
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {tuple(modules)!r}:
                    raise ModuleNotFoundError(name, name=name)
        sys.meta_path.insert(0, Block())
    """) + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("stmt, dist", [("from ck_gemm import matmul", "ck-gemm"),
                                        ("from ck_conv import conv2d", "ck-conv"),
                                        ("import ck_fmha; ck_fmha.attention(1, 2, 3)", "ck-fmha")])
def test_torch_entry_points_without_torch_name_the_extra(stmt, dist):
    r = _blocked(["torch"], f"""
        try:
            {stmt}
        except ImportError as exc:
            from ck_core.errors import MissingDependency
            print(type(exc).__name__, isinstance(exc, MissingDependency), exc)
    """)
    assert f"MissingDependency True" in r.stdout and f"pip install '{dist}[torch]'" in r.stdout, r.stdout + r.stderr


def test_sweep_plot_without_matplotlib_fails_before_the_sweep():
    r = _blocked(["matplotlib"], """
        import time
        t0 = time.perf_counter()
        from ck_core.cli import main
        rc = main(["sweep", "gemm", "--arch", "gfx942", "--dtypes", "fp16", "--max-kernels", "1", "--plot"])
        print("rc", rc, "secs", time.perf_counter() - t0)
    """)
    assert "rc 4" in r.stdout and "ck-core[plot]" in r.stderr, r.stdout + r.stderr
    assert float(r.stdout.split("secs")[1]) < 10


def test_demo_with_an_unavailable_backend_says_so_once(capsys):
    rc, out, err = _main(capsys, "demo", "--backend", "ck")
    assert rc == 4 and err.count("ck: error:") == 1 and "hipcc" in err and "[gemm]" not in out, out + err


# -- every problem field documents itself (attrs metadata), and --help prints it -------------------

def _problem_classes():
    return [(name, spec.problem_type) for name, spec in sorted(get_manager().ops().items())]


@pytest.mark.parametrize("op", ["gemm", "conv", "fmha"])
def test_every_problem_field_has_its_own_help(op):
    import re

    cls = get_manager().op(op).problem_type
    module = sys.modules[cls.__module__]
    constants = [n for n, v in vars(module).items() if n.isupper() and len(n) > 3 and isinstance(v, (tuple, dict))]
    helps = {}
    for f in attrs.fields(cls):
        text = (f.metadata or {}).get("help", "")
        assert isinstance(text, str) and len(text.split()) >= 2, f"{cls.__name__}.{f.name} has no help"
        # no constant left unexpanded ("one of FAMILIES"): the values themselves are listed
        assert not [c for c in constants if re.search(rf"\b{c}\b", text)], (f.name, text)
        helps[f.name] = text
    dup = [n for n, t in helps.items() if list(helps.values()).count(t) > 1]
    assert not dup, f"fields sharing one help text: {dup}"


def test_field_help_says_what_each_field_is():
    """Spot checks against what the fields do (the docstring parser gave --deterministic the
    bias-gradient line and --mode 'one of FAMILIES')."""
    from ck_core.cli_help import field_help
    from ck_conv import ConvProblem
    from ck_fmha.problem import FAMILIES, FmhaProblem
    from ck_gemm import GemmProblem
    from ck_gemm.problem import ACTIVATIONS, LAYOUTS

    f = field_help(FmhaProblem)
    assert "dq" in f["deterministic"] and "bias" not in f["deterministic"]
    assert "dbias" in f["dbias"] and "group" in f["mode"] and "FAMILIES" not in f["mode"]
    assert all(fam in f["family"] for fam in FAMILIES)
    assert "causal" in f["mask"] and "sequences" in f["batch"] and "query heads" in f["nhead_q"]
    assert "seed" in f["seed"] and "offset" in f["offset"]
    g = field_help(GemmProblem)
    assert all(x in g["layout"] for x in LAYOUTS) and all(x in g["activation"] for x in ACTIVATIONS)
    c = field_help(ConvProblem)
    assert "bwd_weight" in c["direction"] and "groups" in c["G"]


@pytest.mark.parametrize("op", ["gemm", "conv", "fmha"])
def test_run_help_prints_each_fields_help(capsys, monkeypatch, op):
    monkeypatch.setenv("COLUMNS", "90")
    with pytest.raises(SystemExit):
        main(["run", op, "--help"])
    out = capsys.readouterr().out
    assert max(len(ln) for ln in out.splitlines()) <= 90
    flat = " ".join(out.split())
    for f in attrs.fields(get_manager().op(op).problem_type):
        assert " ".join(f.metadata["help"].split()) in flat, f.name


# -- one message per problem, exit codes that tell the problems apart ------------------------------

def test_build_without_hipcc_says_each_error_once_and_exits_4(capsys, caplog):
    if __import__("shutil").which("hipcc"):
        pytest.skip("hipcc is installed here")
    rc, out, err = _main(capsys, "build", "gemm", "--arch", "gfx942", "--backend", "ck", "--limit", "2")
    assert rc == 4, out + err
    failed = [ln for ln in out.splitlines() if ln.startswith("FAILED ")]
    assert len(failed) == 2
    for ln in failed:
        name = ln.split()[1].rstrip(":")
        assert (out + err + caplog.text).count(name + ":") + (out + err + caplog.text).count(name + " failed") == 1, name


def test_tune_on_the_numpy_backend_warns_its_winner_is_noise(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("CK_TUNED_DIR", str(tmp_path / "store"))
    rc, out, err = _main(capsys, "tune", "gemm", "--arch", "gfx942", "--m", "40", "--n", "24", "--k", "16",
                         "--top", "3", "--repeat", "1")
    assert rc == 0 and f"winner recorded in {tmp_path / 'store' / 'gemm' / 'gfx942.json'}" in out
    assert "ck: warning:" in err and "noise" in err and "--backend triton" in err, err


def test_tuning_warnings_name_a_tie():
    from ck_core.cli import tuning_warnings

    class Timed:
        timer = staticmethod(lambda fn, n: 0.0)

    assert tuning_warnings(Timed, "triton", [("a", 1.0), ("b", 1.5)], 5) == []
    (w,) = tuning_warnings(Timed, "triton", [("a", 1.0), ("b", 1.01), ("c", 2.0)], 5)
    assert "1.0%" in w and "--repeat" in w


def test_numpy_sweep_of_the_smoke_matrix_is_quick_and_quiet(tmp_path):
    """152 s for three rows before (LLM-sized GEMMs in NumPy, 'compile: 0/0' every 30 s): shapes over
    the host budget are rows that say so."""
    out = tmp_path / "s.json"
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "ck_core", "sweep", "gemm", "--arch", "gfx942", "--dtypes", "fp16",
                        "--layouts", "rcr", "--category", "smoke", "--max-kernels", "2", "--json", str(out)],
                       capture_output=True, text=True, timeout=300,
                       env={**__import__("os").environ, "CK_CACHE_DIR": str(tmp_path / "c")})
    assert r.returncode == 0, r.stderr[-2000:]
    assert time.perf_counter() - t0 < 90
    assert "compile: 0/0" not in r.stderr
    rows = json.loads(out.read_text())["results"]
    big = [x for x in rows if x["status"] == "unsupported" and "too large for the numpy backend" in x["error"]]
    assert big and any(x["status"] == "ok" for x in rows)
