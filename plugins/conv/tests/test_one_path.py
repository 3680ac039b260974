"""One path for conv: the names ``ck_after_run`` reports are the kernels the launcher ran, split
included; the split is chosen by selection (a key field), never by the launcher."""
import attrs
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from ck_conv.backends.triton import launch as L  # noqa: E402
from ck_conv.api import conv2d  # noqa: E402
from ck_conv.keys import config_of, supports  # noqa: E402
from ck_conv.problem import ConvProblem  # noqa: E402
from ck_core import Dispatcher, Registry, api  # noqa: E402
from ck_core.errors import UnsupportedProblem  # noqa: E402


@pytest.fixture
def ran(monkeypatch):
    """(config name, splits of the reduction as launched) of every conv launch."""
    out = []
    real_run, real_split, real_sk = L.run, L._SplitOut.__init__, L._StreamK.__init__
    state = {}

    def run(p, tensors, config, num_sms=None, **kw):
        state["splits"] = 1
        y = real_run(p, tensors, config, num_sms, **kw)
        out.append((config.name, state["splits"]))
        return y

    def split_init(self, final, nsplit, reduction, ntiles):
        state["splits"] = nsplit
        real_split(self, final, nsplit, reduction, ntiles)

    monkeypatch.setattr(L, "run", run)
    monkeypatch.setattr(L._SplitOut, "__init__", split_init)
    monkeypatch.setattr(L._StreamK, "__init__", real_sk)
    return out


def _check_launched(log, ran, keys):
    runs = log.take()
    assert runs and len(runs) == len(ran)
    for (_, plan, launched), (cfg_name, splits) in zip(runs, ran):
        assert launched == plan and len(launched) == 1
        key = keys[launched[0]]
        cfg = config_of(key)
        assert cfg.name == cfg_name
        if cfg.specialization != "depthwise" and cfg.reduction != "streamk":
            assert splits == cfg.split, (key.name, splits)


def test_public_conv2d_runs_what_it_reports(ck_dispatch_log, ran, ck_rng, monkeypatch):
    monkeypatch.setenv("CK_BACKEND", "triton")
    api.clear()
    g = torch.Generator().manual_seed(int(ck_rng.integers(1 << 30)))
    x = torch.randn(2, 6, 7, 5, generator=g, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, generator=g, requires_grad=True)
    y = conv2d(x, w, stride=1, padding=1, groups=2)
    y.backward(torch.randn(y.shape, generator=g))
    want = torch.nn.functional.conv2d(x.detach().double(), w.detach().double(), padding=1, groups=2)
    assert float((y.detach().double() - want).norm() / want.norm()) < 1e-4
    keys = {k.name: k for d in api._DISPATCHERS.values() for k in d.registry}
    runs = list(ck_dispatch_log.runs)
    assert {r[0].direction for r in runs} == {"forward", "bwd_data", "bwd_weight"}
    assert all(r[0].split_k == 0 for r in runs)        # the API asks for any split
    _check_launched(ck_dispatch_log, ran, keys)
    api.clear()


def test_dispatcher_picks_the_split_and_runs_it(ck_dispatch_log, ran, ck_rng, monkeypatch):
    # a long pixel reduction, few output tiles: selection must split, the launch must split as named
    # (launches free here: this small problem's split pays for its memset and cast only where a launch
    # costs nothing; test_launch_cost.py holds the cost's side)
    from ck_conv import heuristics

    monkeypatch.setattr(heuristics, "launch_cost", lambda: (0.0, 0.25))
    monkeypatch.setattr(heuristics, "_PREFERRED", {})
    p = ConvProblem(N=2, G=1, C=5, K=7, input_spatial=(17, 19), filter=(3, 3), pad_left=(1, 1),
                    pad_right=(1, 1), direction="bwd_weight", dtype="fp32", split_k=0)
    reg = Registry.from_enumeration("conv", "fake64", "triton", directions=["bwd_weight"], dtypes=["fp32"],
                                    ndims=[2], specializations=["filter3x3"], tiles=[(32, 32, 16)],
                                    pipelines=["compv3"])
    splits = {k.algorithm.split for k in reg if supports(k, p) is None}
    assert {1, 2, 4} <= splits
    disp = Dispatcher(reg, backend="triton")
    key = disp.select(p)
    assert key.algorithm.split > 1
    g = torch.Generator().manual_seed(int(ck_rng.integers(1 << 30)))
    x, dy = torch.randn(p.input_shape, generator=g), torch.randn(p.output_shape, generator=g)
    dw = disp.run(p, x=x, dy=dy)
    xt = x.double().reshape(2, 17, 19, 5).permute(0, 3, 1, 2).requires_grad_()
    wt = torch.zeros(7, 5, 3, 3, dtype=torch.float64, requires_grad=True)
    yt = torch.nn.functional.conv2d(xt, wt, padding=1)
    (yt * dy.double().reshape(2, 17, 19, 7).permute(0, 3, 1, 2)).sum().backward()
    want = wt.grad.permute(0, 2, 3, 1).reshape(p.weight_shape)
    assert float((dw.double() - want).norm() / want.norm()) < 1e-5
    _check_launched(ck_dispatch_log, ran, {k.name: k for k in reg})


def test_a_split_that_would_run_shorter_is_a_supports_reason(ck_dispatch_log):
    # 2 x 5 x 6 = 60 pixels in BLOCK_K=64 chunks: one chunk, whatever split is asked
    p = ConvProblem(N=2, G=1, C=4, K=4, input_spatial=(5, 6), filter=(3, 3), pad_left=(1, 1), pad_right=(1, 1),
                    direction="bwd_weight", dtype="fp32", split_k=0)
    reg = Registry.from_enumeration("conv", "fake64", "triton", directions=["bwd_weight"], dtypes=["fp32"],
                                    ndims=[2], specializations=["filter3x3"], tiles=[(32, 32, 64)],
                                    pipelines=["compv3"])
    split4 = next(k for k in reg if k.algorithm.split == 4)
    assert "non-empty" in supports(split4, p)
    assert all(k.algorithm.split == 1 for k in reg if supports(k, p) is None)
    x = torch.randn(p.input_shape)
    with pytest.raises(UnsupportedProblem, match="non-empty"):
        L.run(p, {"x": x, "dy": torch.randn(p.output_shape)}, config_of(split4))
    one = next(k for k in reg if k.algorithm.split == 1)
    assert "split_k=2" in supports(one, attrs.evolve(p, split_k=2))
