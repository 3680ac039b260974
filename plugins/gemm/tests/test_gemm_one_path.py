"""One path for GEMM on sm90's Triton kernel space (CPU interpreter): what the Dispatcher
selects is what the launcher runs, and TMA alignment is a ``supports()`` reason, not a
launcher-side swap to another kernel."""
import attrs
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from ck_core import Dispatcher, PluginManager, Registry, api, plugins  # noqa: E402
from ck_core.testing import DispatchLog  # noqa: E402
from ck_gemm import GemmProblem, matmul  # noqa: E402
from ck_gemm.keys import DESCRIPTOR_VARIANTS, supports, variant_violation  # noqa: E402
from ck_gemm.space import enumerate_keys  # noqa: E402
from ck_gemm.backends.triton import launch as L  # noqa: E402
from ck_gemm.backends.triton.keys import config_of  # noqa: E402


@pytest.fixture
def sm90(monkeypatch):
    """The installed plugins (sm90 among them) plus a log of every Dispatcher run; CPU tensors
    dispatch on sm90."""
    log = DispatchLog()
    log.manager = PluginManager(plugins=[log])
    monkeypatch.setattr(plugins, "_MANAGER", log.manager)
    monkeypatch.setenv("CK_CPU_ARCH", "sm90")
    api.clear()
    yield log
    api.clear()


@pytest.fixture
def ran(monkeypatch):
    """The GemmConfig of every main kernel the launcher launches (split-K reductions left out)."""
    cfgs = []
    real = L._launch

    def spy(spec, vals, M, N, batch, name):
        if "config" in spec.meta:
            cfgs.append(spec.meta["config"])
        real(spec, vals, M, N, batch, name)

    monkeypatch.setattr(L, "_launch", spy)
    return cfgs


def _keys_by_name(*registries) -> dict:
    return {k.name: k for reg in registries for k in reg}


def _assert_launched_is_what_ran(log, ran, keys):
    runs = log.take()
    assert runs and len(ran) == len(runs)
    for (_, plan, launched), cfg in zip(runs, ran):
        assert launched == plan and len(launched) == 1
        assert config_of(keys[launched[0]]) == cfg, (launched[0], cfg.name)


def _reference(a, b, d=()):
    out = a.double() @ b.double()
    for x in d:
        out = out + x.double()
    return out


def _rel(x, ref):
    return float((x.double() - ref).norm() / ref.norm())


def _sm90(log, **options):
    return Registry.from_enumeration("gemm", "sm90", "triton", manager=log.manager, **options)


def test_misaligned_problems_select_pointer_keys(sm90):
    reg = _sm90(sm90, dtypes=["fp16"], layouts=["rcr", "crr"])
    variants = {k.algorithm.variant for k in reg}
    assert {"tile", "persistent", "tma"} <= variants
    odd = GemmProblem(m=37, n=45, k=29, dtype="fp16", layout="rcr")     # A's rows: 29 x 2 B
    ok = [k for k in reg if supports(k, odd) is None]
    assert ok and not any(k.algorithm.variant in DESCRIPTOR_VARIANTS for k in ok)
    for k in reg:
        if k.signature.layout == "rcr" and k.algorithm.variant in DESCRIPTOR_VARIANTS:
            assert "16 B" in supports(k, odd)
    assert Dispatcher(reg, backend="triton").select(odd).algorithm.variant in ("tile", "persistent", "streamk")
    # a column-major A is stored K x M: M decides there, K does not
    col = GemmProblem(m=37, n=48, k=40, dtype="fp16", layout="crr")
    assert not any(supports(k, col) is None and k.algorithm.variant in DESCRIPTOR_VARIANTS for k in reg)
    assert "A's stored rows" in supports(next(k for k in reg if k.signature.layout == "crr"
                                              and k.algorithm.variant == "tma"), col)
    aligned = GemmProblem(m=37, n=48, k=40, dtype="fp16", layout="rcr")
    assert any(k.algorithm.variant == "tma" and supports(k, aligned) is None for k in reg)


def test_c_descriptor_reasons(sm90):
    reg = _sm90(sm90, dtypes=["fp16"], layouts=["rcr"])
    cs = [k for k in reg if k.algorithm.variant in ("tma_cs", "tma_persistent_cs")]
    assert cs
    key = cs[0]
    assert supports(key, GemmProblem(m=40, n=48, k=40, dtype="fp16", layout="rcr")) is None
    assert "C's rows" in supports(key, GemmProblem(m=40, n=44, k=40, dtype="fp16", layout="rcr"))
    # fp32 C: 44 columns are 176 B, aligned again
    f32 = attrs.evolve(key, signature=attrs.evolve(key.signature, dtype_c="fp32"))
    assert supports(f32, GemmProblem(m=40, n=44, k=40, dtype="fp16", dtype_c="fp32", layout="rcr")) is None


def test_split_k_enumeration_keeps_only_split_variants(sm90):
    arch = sm90.manager.arch("sm90")
    keys = enumerate_keys(arch, "triton", {"dtypes": ["fp16"], "layouts": ["rcr"], "split_ks": [1, 2]})
    split = [k for k in keys if k.algorithm.split_k > 1]
    assert split and all(variant_violation(k.algorithm) is None for k in keys)
    assert {k.algorithm.variant for k in split} <= {"tile", "tma", "tma_ws"}


def test_dispatcher_runs_the_selected_key(sm90, ran, ck_rng):
    # one pointer key and its TMA twin: the aligned problem may take either, the odd one only the pointer key
    reg = _sm90(sm90, dtypes=["fp16"], layouts=["rcr"]).filter(
        "c.tile_m == 64 and c.tile_n == 64 and c.warp_n == 1 and c.stages == 3 "
        "and c.variant in ('tile', 'tma') and c.split_k == 1")
    assert sorted(k.algorithm.variant for k in reg) == ["tile", "tma"]
    disp = Dispatcher(reg, backend="triton")
    g = torch.Generator().manual_seed(int(ck_rng.integers(1 << 30)))
    for m, n, k in ((37, 48, 40), (45, 31, 27)):
        p = GemmProblem(m=m, n=n, k=k, dtype="fp16", layout="rcr")
        a = torch.randn(m, k, generator=g).half()
        b = torch.randn(n, k, generator=g).half()
        c = disp.run(p, a, b)
        assert _rel(c, _reference(a, b.t())) < 2e-3
        if k % 8:
            assert disp.select(p).algorithm.variant == "tile"
    _assert_launched_is_what_ran(sm90, ran, _keys_by_name(reg))


def test_public_matmul_runs_what_it_reports(sm90, ran, ck_rng):
    g = torch.Generator().manual_seed(int(ck_rng.integers(1 << 30)))
    cases = [((37, 29), (29, 45), ()),                      # odd everything: pointer keys only
             ((40, 40), (40, 48), ()),                      # aligned: TMA keys may win
             ((33, 24), (24, 16), ("bias",))]
    for sa, sb, d in cases:
        a = torch.randn(*sa, generator=g).half()
        b = torch.randn(*sb, generator=g).half()
        ds = [torch.randn(sb[1], generator=g).half()] if d else []
        c = matmul(a, b, d=ds)
        assert _rel(c, _reference(a, b, ds)) < 3e-3
    keys = _keys_by_name(*(disp.registry for disp in api._DISPATCHERS.values()))
    runs = list(sm90.runs)
    _assert_launched_is_what_ran(sm90, ran, keys)
    odd = runs[0][2][0]
    assert keys[odd].algorithm.variant not in DESCRIPTOR_VARIANTS


def test_a_misaligned_tensor_is_refused_not_swapped(sm90, ran):
    from ck_core.errors import UnsupportedProblem

    reg = _sm90(sm90, dtypes=["fp16"], layouts=["rcr"]).filter(
        "c.tile_m == 64 and c.tile_n == 64 and c.warp_n == 1 and c.stages == 3 and c.variant == 'tma'")
    key = next(iter(reg))
    p = GemmProblem(m=40, n=48, k=40, dtype="fp16", layout="rcr")
    assert supports(key, p) is None
    buf = torch.randn(40 * 40 + 1).half()
    a = buf[1:].view(40, 40)                             # 2-byte offset: no descriptor for it
    b = torch.randn(48, 40).half()
    with pytest.raises(UnsupportedProblem, match=key.name.split(".")[0]):
        Dispatcher(reg, backend="triton").run(p, a, b)
    assert ran == []
    assert np.isfinite(float(a.float().sum()))
