"""FMHA through the dispatcher on the numpy backend: plans, stages, selection, errors."""
import numpy as np
import pytest

from ck_core import CkError, Dispatcher, KernelKey, MissingKernel, Registry, get_manager
from ck_core.testing import check_against_reference
from ck_fmha.problem import FmhaProblem

if "gfx942" not in get_manager().archs():
    pytest.skip("ck-arch-gfx942 is not installed", allow_module_level=True)


@pytest.fixture(scope="module")
def disp():
    return Dispatcher(Registry.from_enumeration("fmha", "gfx942", receipt=0))


BASE = dict(batch=2, nhead_q=6, nhead_k=2, seqlen_q=37, seqlen_k=53, hdim_q=64, dtype="fp16")


@pytest.mark.parametrize("kw", [
    dict(family="fwd"),
    dict(family="fwd", mask="top_left", lse=True),
    dict(family="fwd", mask="bottom_right", bias="alibi"),
    dict(family="fwd", mask="generic", window_left=5, window_right=3, bias="elementwise"),
    dict(family="fwd", logits_soft_cap=30.0, dtype="bf16"),
    dict(family="fwd", p_drop=0.2, seed=7, offset=3, lse=True),
    dict(family="fwd", hdim_q=128, hdim_v=128),
])
def test_forward_dispatch_validates(disp, kw, ck_rng):
    p = FmhaProblem(**{**BASE, **kw})
    rep = check_against_reference(disp, p, ck_rng)
    assert rep.passed, str(rep)
    assert len(disp.plan(p).stages) == 1


@pytest.mark.parametrize("splits", [1, 2, 5])
def test_splitkv_plan_equals_one_shot(disp, splits, ck_rng):
    p = FmhaProblem(**{**BASE, "family": "fwd_splitkv", "num_splits": splits, "seqlen_q": 3})
    plan = disp.plan(p)
    # one split: the main stage alone writes o and lse (one launch, no combine)
    assert [s.name for s in plan.stages] == ["fwd_splitkv"] + ["fwd_splitkv_combine"] * (splits > 1)
    rep = check_against_reference(disp, p, ck_rng)
    assert rep.passed, str(rep)


@pytest.mark.parametrize("kw", [dict(), dict(mask="top_left"), dict(deterministic=True),
                                dict(bias="elementwise", dbias=True, mask="bottom_right")])
def test_backward_plan_equals_one_shot(disp, kw, ck_rng):
    p = FmhaProblem(**{**BASE, "family": "bwd_dq_dk_dv", **kw})
    assert [s.name for s in disp.plan(p).stages] == ["bwd_dot_do_o", "bwd_dq_dk_dv", "bwd_convert_dq"]
    rep = check_against_reference(disp, p, ck_rng)
    assert rep.passed, str(rep)


def test_group_mode_with_empty_sequence(disp, ck_rng):
    p = FmhaProblem(family="fwd", mode="group", batch=3, nhead_q=4, nhead_k=4, hdim_q=64,
                    seqstart_q=(0, 17, 17, 40), seqstart_k=(0, 29, 29, 60), mask="bottom_right")
    assert check_against_reference(disp, p, ck_rng).passed


def test_paged_and_prefill(disp, ck_rng):
    p = FmhaProblem(family="fwd_pagedkv", batch=2, nhead_q=4, nhead_k=2, seqlen_q=1, seqlen_k=300,
                    seqlens_k=(300, 77), hdim_q=128, paged_kv=True, page_size=64)
    assert check_against_reference(disp, p, ck_rng).passed
    q = FmhaProblem(family="batch_prefill", mode="group", batch=2, nhead_q=4, nhead_k=4, hdim_q=128,
                    seqstart_q=(0, 5, 12), seqlens_k=(33, 17), paged_kv=True,
                    page_size=16, kv_layout="vectorized", kv_lookup="sglang")
    assert check_against_reference(disp, q, ck_rng).passed


def test_appendkv_rope(disp, ck_rng):
    p = FmhaProblem(family="fwd_appendkv", batch=2, nhead_q=4, nhead_k=2, seqlen_q=3, seqlen_k=64,
                    seqlens_k=(20, 41), seqlen_knew=3, hdim_q=64, rope="interleaved", rotary_dim=32)
    assert check_against_reference(disp, p, ck_rng).passed


def test_wrong_output_fails_validation(disp, ck_rng):
    from ck_core.validate import compare_all
    from ck_fmha.plan import reference, tolerance

    p = FmhaProblem(**{**BASE, "family": "fwd"})
    t = get_manager().op("fmha").make_inputs(p, ck_rng)
    out = disp.run_dict(p, t)
    bad = dict(out, o=out["o"].copy())
    bad["o"][0, 1, 2, 3] += 0.5
    assert not compare_all(bad, reference(p, t), {"o": "fp16", "lse": "fp32"}, tolerance(p)).passed


def test_no_kernel_for_fp32_on_gfx942_receipt0(disp):
    with pytest.raises(MissingKernel):
        disp.select(FmhaProblem(**{**BASE, "dtype": "fp32"}))


def test_ck_key_names_round_trip(disp):
    keys = list(disp.registry)
    assert len(keys) > 1000
    for key in keys[:: max(1, len(keys) // 300)]:
        assert KernelKey.from_name(key.name) == key
        assert KernelKey.from_dict(key.to_dict()) == key


@pytest.mark.parametrize("kw, match", [
    (dict(hdim_q=60), "multiple of 8"),
    (dict(nhead_q=5, nhead_k=2), "multiple"),
    (dict(family="fwd_pagedkv", paged_kv=True, page_size=48, seqlen_q=1), "power of two"),
    (dict(mode="group", seqstart_q=(0, 9, 4), seqstart_k=(0, 3, 8)), "monoton|decreas|non-decreasing"),
])
def test_bad_problems(kw, match):
    with pytest.raises(CkError, match=match):
        FmhaProblem(**{**BASE, **kw})


def test_mismatched_tensor(disp, ck_rng):
    p = FmhaProblem(**{**BASE, "family": "fwd"})
    t = get_manager().op("fmha").make_inputs(p, ck_rng)
    t["k"] = t["k"][:, :, :-1]
    with pytest.raises(CkError, match="'?k'?"):
        disp.run_dict(p, t)
    t2 = get_manager().op("fmha").make_inputs(p, ck_rng)
    t2["q"] = t2["q"].astype(np.float32)
    with pytest.raises(CkError):
        disp.run_dict(p, t2)


def test_cli_lists_ck_names_matching_the_oracle(capsys):
    """`ck list fmha --ck-names` for the exact families equals CK's own list."""
    import gzip
    from pathlib import Path

    from ck_core.cli import main

    if "gfx950" not in get_manager().archs():
        pytest.skip("ck-arch-gfx950 is not installed")
    oracle = Path(__file__).resolve().parent / "data" / "fmha_gfx950_receipt0.txt.gz"
    with gzip.open(oracle, "rt") as fh:
        names = {line.strip() for line in fh if line.strip()}
    for family, prefix in (("bwd_dot_do_o", "fmha_bwd_dot_do_o_"), ("bwd_convert_dq", "fmha_bwd_convert_dq_")):
        assert main(["list", "fmha", "--arch", "gfx950", "--receipt", "0", "--family", family,
                     "--ck-names"]) == 0
        ours = set(capsys.readouterr().out.split())
        assert ours == {n for n in names if n.startswith(prefix)}
    assert main(["list", "fmha", "--arch", "gfx950", "--receipt", "0", "--family", "fwd", "--count"]) == 0
    assert int(capsys.readouterr().out) == 11980
