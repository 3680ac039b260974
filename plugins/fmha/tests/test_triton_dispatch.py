"""FMHA through the dispatcher on the triton backend (Triton's CPU interpreter here; the GPU
in `-m gpu` runs): every Triton family and plan against the float64 reference."""
import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from ck_core import Dispatcher, KernelKey, MissingKernel, Registry  # noqa: E402
from ck_core.testing import check_against_reference  # noqa: E402
from ck_fmha.problem import FmhaProblem  # noqa: E402

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
                                reason="needs a GPU or TRITON_INTERPRET=1")


@pytest.fixture(scope="module")
def disp():
    from ck_core import PluginManager, plugins
    from ck_core.testing import arch_plugin, make_fake_arch

    mgr = PluginManager(plugins=[arch_plugin(make_fake_arch())])
    old = plugins._MANAGER
    plugins.reset_manager(mgr)
    reg = Registry.from_enumeration("fmha", "fake64", "triton", dtypes="fp16")
    yield Dispatcher(reg, backend="triton")
    plugins.reset_manager(old)


BASE = dict(batch=2, nhead_q=4, nhead_k=2, seqlen_q=37, seqlen_k=45, hdim_q=32, dtype="fp16")


@pytest.mark.parametrize("kw", [
    dict(family="fwd"),
    dict(family="fwd", mask="bottom_right", lse=True),
    dict(family="fwd", mask="generic", window_left=6, window_right=2, logits_soft_cap=20.0),
    dict(family="fwd", layout="bshd", mask="top_left"),
    dict(family="fwd_splitkv", seqlen_q=1, seqlen_k=200, num_splits=3),
    dict(family="bwd_dq_dk_dv", seqlen_k=37, mask="top_left"),
    dict(family="bwd_dq_dk_dv", seqlen_k=37, deterministic=True),
])
def test_triton_plans_match_reference(disp, kw, ck_rng):
    p = FmhaProblem(**{**BASE, **kw})
    rep = check_against_reference(disp, p, ck_rng)
    assert rep.passed, str(rep)


def test_group_mode_forward(disp, ck_rng):
    p = FmhaProblem(family="fwd", mode="group", batch=3, nhead_q=4, nhead_k=4, hdim_q=32,
                    seqstart_q=(0, 17, 17, 40), seqstart_k=(0, 29, 29, 60), mask="bottom_right")
    assert check_against_reference(disp, p, ck_rng).passed


def test_paged_decode(disp, ck_rng):
    p = FmhaProblem(family="fwd_pagedkv", batch=2, nhead_q=4, nhead_k=2, seqlen_q=1, seqlen_k=96,
                    seqlens_k=(96, 41), hdim_q=32, paged_kv=True, page_size=16, layout="bshd")
    assert check_against_reference(disp, p, ck_rng).passed


def test_unsupported_features_are_clear(disp):
    with pytest.raises(MissingKernel, match="bias"):
        disp.select(FmhaProblem(**{**BASE, "bias": "alibi"}))


def test_triton_names_round_trip(disp):
    for key in disp.registry:
        assert KernelKey.from_name(key.name) == key
        assert KernelKey.from_dict(key.to_dict()) == key
