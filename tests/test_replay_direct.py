"""A recorded launch without descriptors or scratch memory calls the compiled launcher directly,
with exactly the arguments Triton's ``CudaLauncher.__call__`` would pass it (issue #26: one Python
frame less per warm launch); one with scratch memory keeps Triton's own call."""
import types

import pytest

pytest.importorskip("torch")

from ck_core.backends import triton_replay  # noqa: E402


class CudaLauncher:
    """A stand-in for triton's CudaLauncher: ``__call__`` as triton 3.6 writes it (no scratch)."""

    def __init__(self, scratch=0):
        self.global_scratch_size = scratch
        self.profile_scratch_size = 0
        self.launch_cooperative_grid = False
        self.launch_pdl = True
        self.direct, self.wrapped = [], []
        self.launch = lambda *a: self.direct.append(a)

    def __call__(self, gx, gy, gz, stream, function, *args):
        self.wrapped.append((gx, gy, gz, stream, function, self.launch_cooperative_grid, self.launch_pdl, None,
                             None, *args))


def _replay(run, monkeypatch):
    import torch

    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda dev: 77, raising=False)
    kernel = types.SimpleNamespace(run=run, function=5, packed_metadata=("meta",))
    return triton_replay.Replay(kernel, ["x", "n"], ["x0", 3], (4, 2), 0, {}, None)


def test_direct_launch_passes_what_the_launcher_wrapper_would(monkeypatch):
    run = CudaLauncher()
    r = _replay(run, monkeypatch)
    r(["x1", 9])
    assert not run.wrapped and len(run.direct) == 1
    run.launch = lambda *a: run.wrapped.append(a)   # what Triton's own __call__ hands its launch
    CudaLauncher.__call__(run, 4, 2, 1, 77, 5, ("meta",), None, None, None, "x1", 9)
    assert run.direct[0] == run.wrapped[0] == (4, 2, 1, 77, 5, False, True, None, None, ("meta",), None, None, None,
                                               "x1", 9)


def test_scratch_memory_keeps_tritons_call(monkeypatch):
    run = CudaLauncher(scratch=128)
    r = _replay(run, monkeypatch)
    r(["x1", 9])
    assert not run.direct and len(run.wrapped) == 1


def test_other_launchers_keep_tritons_call(monkeypatch):
    class HIPLauncher(CudaLauncher):
        pass

    run = HIPLauncher()
    _replay(run, monkeypatch)(["x1", 9])
    assert not run.direct and len(run.wrapped) == 1


def test_tritons_cuda_launcher_passes_its_arguments_as_the_direct_call_does():
    """Written against triton 3.6: its CudaLauncher.__call__ hands the compiled launch exactly
    (grid, stream, function, cooperative, pdl, scratch, scratch, *args); a triton that changes this
    must fail here, not launch with shifted arguments."""
    import inspect

    driver = pytest.importorskip("triton.backends.nvidia.driver")
    src = inspect.getsource(driver.CudaLauncher.__call__)
    assert ("self.launch(gridX, gridY, gridZ, stream, function, self.launch_cooperative_grid, self.launch_pdl,"
            in src and "global_scratch, profile_scratch, *args)" in src), src


def test_a_replay_keeps_no_recorded_tensor_once_released(monkeypatch):
    """The recorded call's tensors live in ``args`` alone (descriptor templates keep no base): once the
    caller released them nothing of that call stays alive (torch.compile(mode="reduce-overhead") refuses
    a tensor of a CUDA graph's warm-up kept past it), and a replay's descriptor wraps the tensor given."""
    import gc
    import weakref

    import torch

    td = pytest.importorskip("triton.tools.tensor_descriptor")
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda dev: 77, raising=False)
    run = CudaLauncher()
    kernel = types.SimpleNamespace(run=run, function=5, packed_metadata=("meta",))
    base, out = torch.zeros(4, 8), torch.zeros(4)
    desc = td.TensorDescriptor(base, [4, 8], [8, 1], [2, 8])
    r = triton_replay.Replay(kernel, ["x_desc", "o", "n"], [desc, out, 3], (4,), 0, {0: desc}, None)
    assert r.args[0] is base and r.desc_slots == (0,)
    gone = [weakref.ref(base), weakref.ref(out)]
    r.release()
    assert r.args == [None, None, 3]
    del base, out, desc
    gc.collect()
    assert all(w() is None for w in gone), "a released replay still holds a recorded tensor"
    fresh, o2 = torch.ones(4, 8), torch.ones(4)
    r([fresh, o2, 3])
    sent = run.wrapped[-1][-3:]
    assert sent[0].base is fresh and sent[0].shape == [4, 8] and sent[1] is o2 and sent[2] == 3


def test_a_decomposed_descriptor_expansion_is_not_cached(monkeypatch):
    """A descriptor without TMA metadata expands to its base tensor itself: the replay builds it per call
    (a cache by address would keep that call's tensor alive) and passes the tensor given."""
    import gc
    import weakref

    import torch

    td = pytest.importorskip("triton.tools.tensor_descriptor")
    pytest.importorskip("triton.backends.nvidia.driver")
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda dev: 77, raising=False)
    got = []
    kernel = types.SimpleNamespace(run=CudaLauncher(), function=5, packed_metadata=("meta",))
    base = torch.zeros(4, 8)
    desc = td.TensorDescriptor(base, [4, 8], [8, 1], [2, 8])
    r = triton_replay.Replay(kernel, ["x_desc", "n"], [desc, 3], (4,), 0, {0: desc},
                             (lambda *a: got.append(a), {0: None}))
    r.release()
    for _ in range(2):
        x = torch.ones(4, 8)
        r([x, 3])
        assert got[-1][13] is x and list(got[-1][14:]) == [4, 8, 8, 1, False, 4, 8, 8, 1, 3]
    gone = weakref.ref(x)
    del x, base, desc
    got.clear()
    gc.collect()
    assert gone() is None, "the replay keeps a tensor of an earlier call"
