"""One path: the device's arch plugin, the public-API Dispatchers, hooks for demo cases and knobs,
a core that names no plugin, and torch.compile of the public ops."""
import re
import types
from pathlib import Path

import pytest

from ck_core import DemoCase, PluginManager, api, device, hookimpl, knobs, plugins
from ck_core.errors import ConfigError, PluginError, UnsupportedProblem
from ck_core.knobs import Knob
from ck_core.testing import arch_plugin, make_fake_arch

CORE = Path(__file__).resolve().parents[1] / "ck_core"


def test_core_names_no_plugin():
    pattern = re.compile(r"ck_(gemm|fmha|conv)")
    hits = [f"{p.name}:{i}" for p in CORE.rglob("*.py")
            for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert hits == []


def _gpu_arch(name, target):
    import attrs

    return attrs.evolve(make_fake_arch(name=name), triton_target=target)


def test_current_arch_matches_the_triton_target(monkeypatch):
    torch = pytest.importorskip("torch")
    cuda, rocm = _gpu_arch("cuda90", ("cuda", 90, 32)), _gpu_arch("gfxtest", ("hip", "gfxtest", 64))
    mgr = PluginManager(plugins=[arch_plugin(cuda, rocm)], autoload=False)
    monkeypatch.setattr(device, "_gpu_target", lambda index: ("cuda", 90))
    assert device.current_arch(torch.device("cuda", 0), mgr) is mgr.arch("cuda90")
    monkeypatch.setattr(device, "_gpu_target", lambda index: ("hip", "gfxtest"))
    assert device.current_arch(torch.device("cuda", 1), mgr).name == "gfxtest"
    monkeypatch.setattr(device, "_gpu_target", lambda index: ("cuda", 100))
    with pytest.raises(UnsupportedProblem, match="ck-arch-sm100"):
        device.current_arch(torch.device("cuda", 0), mgr)
    with pytest.raises(UnsupportedProblem, match="mps"):
        device.current_arch(torch.device("mps"), mgr)


def test_cpu_arch_is_the_knob_or_a_default(monkeypatch):
    torch = pytest.importorskip("torch")
    a, b = make_fake_arch(name="zz1"), make_fake_arch(name="aa2")
    mgr = PluginManager(plugins=[arch_plugin(a, b)], autoload=False)
    monkeypatch.delenv("CK_CPU_ARCH", raising=False)
    assert device.current_arch(torch.ones(1), mgr).name == "aa2"   # first by name (no gfx942 here)
    monkeypatch.setenv("CK_CPU_ARCH", "zz1")
    assert device.current_arch(torch.ones(1), mgr).name == "zz1"
    monkeypatch.setenv("CK_CPU_ARCH", "nope")
    with pytest.raises(PluginError, match="nope"):
        device.current_arch(torch.ones(1), mgr)


def test_api_registry_hook_and_dispatcher_cache(fake_arch):
    pytest.importorskip("ck_gemm")
    from ck_core import Registry, enumerate_keys

    asked = []

    class Chooser:
        @hookimpl
        def ck_api_registry(self, op, arch, backend, options):
            asked.append((op, arch.name, backend, dict(options)))
            keys = enumerate_keys(op, arch.name, backend, manager=mgr, **options)[:3]
            return Registry(arch.name, keys, manager=mgr)

    mgr = PluginManager(plugins=[arch_plugin(fake_arch), Chooser()])
    d1 = api.dispatcher_for("gemm", fake_arch, "numpy", manager=mgr, dtypes=("fp32",))
    d2 = api.dispatcher_for("gemm", "fake64", "numpy", manager=mgr, dtypes=("fp32",))
    assert d1 is d2 and len(d1.registry) == 3
    assert asked == [("gemm", "fake64", "numpy", {"dtypes": ("fp32",)})]
    api.dispatcher_for("gemm", fake_arch, "numpy", manager=mgr, dtypes=("fp16",))
    assert len(asked) == 2


def _plugin(**hooks):
    mod = types.ModuleType("ck_test_hooks")
    for name, fn in hooks.items():
        setattr(mod, name, hookimpl(fn))
    return mod


def test_plugins_declare_knobs(monkeypatch):
    knob = Knob("CK_TEST_SPEED", knobs.parse_int, 3, "A test knob.")
    mgr = PluginManager(plugins=[_plugin(ck_declare_knobs=lambda: [knob])], autoload=False)
    monkeypatch.setattr(plugins, "_MANAGER", mgr)
    assert knobs.get("CK_TEST_SPEED") == 3
    monkeypatch.setenv("CK_TEST_SPEED", "7")
    assert knobs.get("CK_TEST_SPEED") == 7 and "CK_TEST_SPEED" in knobs.all_knobs()
    monkeypatch.setenv("CK_TEST_SPEED", "-1")
    with pytest.raises(ConfigError, match="CK_TEST_SPEED"):
        knobs.get("CK_TEST_SPEED")
    with pytest.raises(ConfigError, match="CK_TEST_SPEED"):  # the message lists plugin knobs too
        knobs.get("CK_NO_SUCH_KNOB")
    clash = PluginManager(plugins=[_plugin(ck_declare_knobs=lambda: [Knob("CK_BACKEND", str, "", "x")])],
                          autoload=False)
    with pytest.raises(PluginError, match="CK_BACKEND"):
        clash.knobs()


def test_installed_plugins_declare_their_knobs_and_demo_cases():
    mgr = PluginManager()
    cases = [c for found in mgr.hook.ck_demo_cases() for c in found]
    assert all(isinstance(c, DemoCase) and c.op in mgr.ops() for c in cases)
    if "fmha" in mgr.ops():
        assert "CK_FMHA_GLUON_DKDV" in mgr.knobs()
    if {"gemm", "fmha"} <= set(mgr.ops()):
        assert [c.op for c in sorted(cases, key=lambda c: c.order)][:2] == ["gemm", "fmha"]


def test_after_run_reports_launched_names(ck_dispatch_log, fake_arch):
    pytest.importorskip("ck_gemm")
    import numpy as np

    from ck_core import Dispatcher, Registry
    from ck_core.testing import check_against_reference

    problem = ck_dispatch_log.manager.op("gemm").problem_type(m=9, n=7, k=5, dtype="fp32", layout="rrr")
    reg = Registry.from_enumeration("gemm", fake_arch.name, "numpy", manager=ck_dispatch_log.manager,
                                    dtypes=["fp32"], layouts=["rrr"])
    disp = Dispatcher(reg, backend="numpy")
    assert check_against_reference(disp, problem, np.random.default_rng()).passed     # run_dict
    disp.run(problem, *(np.ones(s, np.float32) for s in (problem.shape_a(), problem.shape_b())))  # run
    runs = ck_dispatch_log.take()
    assert len(runs) == 2 and all(r[2] == (disp.select(problem).name,) for r in runs)


def test_torch_compile_fullgraph_of_a_model_using_the_ops(ck_dispatch_log, ck_rng):
    torch = pytest.importorskip("torch")
    pytest.importorskip("ck_gemm")
    pytest.importorskip("ck_conv")
    from ck_conv import conv2d            # the package exports the torch entry points
    from ck_gemm import linear, matmul

    F = torch.nn.functional

    class Net(torch.nn.Module):
        def __init__(self, ours: bool):
            super().__init__()
            self.ours = ours
            self.w, self.b = torch.nn.Parameter(torch.randn(4, 3, 3, 3) * .3), torch.nn.Parameter(torch.randn(4))
            self.lw, self.lb = torch.nn.Parameter(torch.randn(5, 36) * .1), torch.nn.Parameter(torch.randn(5))
            self.m = torch.nn.Parameter(torch.randn(5, 3))

        def forward(self, x):
            if self.ours:
                y = torch.relu(conv2d(x, self.w, self.b, stride=2, padding=1))
                return matmul(linear(y.flatten(1), self.lw, self.lb), self.m, activation="gelu")
            y = torch.relu(F.conv2d(x, self.w, self.b, stride=2, padding=1))
            return F.gelu(F.linear(y.flatten(1), self.lw, self.lb) @ self.m)

    torch.manual_seed(int(ck_rng.integers(1 << 31)))
    ours = Net(True)
    ref = Net(False).double()
    ref.load_state_dict({k: v.double() for k, v in ours.state_dict().items()})
    x = torch.randn(2, 3, 5, 6)
    out = torch.compile(ours, fullgraph=True, backend="aot_eager")(x)
    out.sum().backward()
    want = ref(x.double())
    want.sum().backward()
    rel = lambda a, b: float((a.detach().double() - b.detach()).norm() / b.detach().norm())  # noqa: E731
    assert rel(out, want) < 1e-5
    for p, q in zip(ours.parameters(), ref.parameters()):
        assert rel(p.grad, q.grad) < 1e-5
    ops = [p.op for p, _, _ in ck_dispatch_log.take()]
    # forward conv, linear, matmul; backward matmul (pre-activation, dA, dB), linear (dX, dW), conv dW
    assert ops.count("conv") == 2 and ops.count("gemm") == 7


def test_arch_check_kit_needs_no_op_plugin():
    import attrs

    from ck_core.testing import check_arch_plugin

    spec = attrs.evolve(make_fake_arch(name="kit1"), triton_target=("hip", "kit1", 64), family="test",
                        peak={"fp16_tflops": 1.0, "mem_gbs": 1.0})
    with pytest.raises(pytest.skip.Exception, match="the nope space"):
        check_arch_plugin(spec, plugin=arch_plugin(spec), name="kit1", vendor="other", target=("hip", "kit1", 64),
                          warp_size=64, lds_bytes=65536, ops=("nope",))


def test_the_tuning_table_decides_what_the_public_api_runs(ck_dispatch_log, tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    pytest.importorskip("ck_gemm")
    from ck_core.winners import Winners
    from ck_gemm import matmul

    monkeypatch.setenv("CK_TUNED_DIR", str(tmp_path / "store"))
    monkeypatch.setenv("CK_BACKEND", "numpy")
    api.clear()
    a, b = torch.rand(33, 17), torch.rand(17, 9)
    matmul(a, b)
    ((problem, (first,), _),) = ck_dispatch_log.take()
    disp = api.dispatcher_on("gemm", a, dtypes=("fp32",), layouts=("rrr",), dtypes_c=("fp32",),
                             num_ds=(0,))
    other = next(k.name for k in disp.rank(problem) if k.name != first)
    table = Winners()
    table.record("fake64", "numpy", problem, other, 1e-6)
    table.save()
    api.clear()
    matmul(a, b)
    ((_, _, launched),) = ck_dispatch_log.take()
    assert launched == (other,)
    api.clear()
