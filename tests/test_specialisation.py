"""What a kernel's integer arguments specialise on (triton_artifacts.specialisation): sizes are
run-time (any value, one artifact), alignment-class integers split on divisibility by 16 only
(never the constant 1), a stride group is one class.  No compile: the specialisation (the cache
key material) of calls is compared, for sm90, in a subprocess without TRITON_INTERPRET (the
interpreter has no binder)."""
import textwrap

import pytest

from ck_core.testing import run_compiled

pytest.importorskip("triton")

SCRIPT = textwrap.dedent('''
    import json
    import torch, triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from ck_core.backends import triton_artifacts as ta
    from ck_core.cache import digest

    @triton.jit
    def k(X, n, M, sa, sb, other, BLOCK: tl.constexpr):
        tl.store(X + tl.arange(0, BLOCK), tl.zeros((BLOCK,), tl.float32))

    ta.specialisation(runtime=("n",), align_only=("M",), groups=[("sa", "sb")])(k)
    t = GPUTarget("cuda", 90, 32)
    x = torch.empty(64, device="meta")

    def key(n=5, M=5, sa=32, sb=48, other=5):
        return digest(ta.specialise(k, [x, n, M, sa, sb, other], {"BLOCK": 16}, t)[3])

    out = {
        "n": len({key(n=v) for v in (1, 2, 16, 17, 4096, 100003)}),
        "M_unit_is_unaligned": key(M=1) == key(M=17),
        "M_classes": len({key(M=v) for v in (1, 7, 16, 32, 33)}),
        "group_all_aligned_differs": key(sa=32, sb=48) != key(sa=40, sb=48),
        "group_one_unaligned_is_unaligned": key(sa=40, sb=48) == key(sa=40, sb=40) == key(sa=1, sb=7),
        "default_unit_is_constant": key(other=1) != key(other=5) and key(other=5) != key(other=16),
    }
    try:
        ta.specialisation(runtime=("nosuch",))(k)
        out["typo"] = "accepted"
    except TypeError as e:
        out["typo"] = str(e)
    print("RESULT" + json.dumps(out))
''')


def test_sizes_do_not_specialise_alignment_classes_do(tmp_path):
    script = tmp_path / "spec.py"   # (triton.jit reads the kernel's source from its file)
    script.write_text(SCRIPT)
    out = run_compiled([script], timeout=300)
    assert out["n"] == 1, out                      # every size: one artifact
    assert out["M_unit_is_unaligned"] and out["M_classes"] == 2, out
    assert out["group_all_aligned_differs"] and out["group_one_unaligned_is_unaligned"], out
    assert out["default_unit_is_constant"], out    # undeclared integers keep Triton's default
    assert "nosuch" in out["typo"], out
