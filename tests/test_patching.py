"""ck_core.patching: the patch / unpatch walk the op plugins' ``nn`` modules share (it names no op)."""
import pytest

torch = pytest.importorskip("torch")

from ck_core.patching import has_own_forward, patch_modules, unpatch_modules  # noqa: E402


class Mine(torch.nn.Linear):
    def forward(self, x):   # a wrapper with its own forward
        return super().forward(x) * 2


def _doubled(self, x):
    return torch.nn.functional.linear(x, self.weight, self.bias) + 1


def _route(name, m):
    if not isinstance(m, torch.nn.Linear) or has_own_forward(m, torch.nn.Linear):
        return None
    m._extra = name
    return _doubled


def test_patch_routes_idempotently_skips_and_unpatch_restores():
    m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), Mine(4, 4), torch.nn.Linear(4, 2))
    x = torch.randn(5, 3)
    ref = m(x)
    assert patch_modules(m, "_t_mark", _route, skip=("3",)) == 1      # "2" has its own forward, "3" skipped
    assert patch_modules(m, "_t_mark", _route, skip=("3",)) == 1      # idempotent
    assert "forward" in vars(m[0]) and "forward" not in vars(m[2]) and "forward" not in vars(m[3])
    assert not torch.equal(m(x), ref)
    assert unpatch_modules(m, "_t_mark", extra=("_extra",)) == 1
    assert not any("forward" in vars(mod) or "_extra" in vars(mod) or hasattr(mod, "_t_mark") for mod in m)
    assert torch.equal(m(x), ref)
