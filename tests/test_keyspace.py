"""A Registry holding a KeySpace behaves as one holding the same keys listed (any op: a toy
space over a listed gemm enumeration, the base class's exact defaults)."""
import random

import pytest

from ck_core import Dispatcher, KeySpace, Registry

pytest.importorskip("ck_gemm")
from ck_gemm import GemmProblem  # noqa: E402


class ListedSpace(KeySpace):
    def __init__(self, keys):
        self.keys = list(keys)
        self.op, self.arch, self.backend = self.keys[0].op, self.keys[0].arch, self.keys[0].backend

    def __iter__(self):
        return iter(self.keys)


@pytest.fixture
def pair(ck_manager, fake_arch):
    plain = Registry.from_enumeration("gemm", fake_arch.name, dtypes=["fp16"])
    keys = list(plain)
    rng = random.Random(4)
    rng.shuffle(keys)   # another order, so that order mistakes show
    plain = Registry(fake_arch.name, keys)
    return plain, Registry(fake_arch.name, spaces=[ListedSpace(keys)])


def _problems(rng, n=8):
    return [GemmProblem(m=rng.randint(1, 300), n=rng.randint(1, 300), k=rng.randint(1, 300), dtype="fp16",
                        layout=rng.choice(["rcr", "rrr", "crr"])) for _ in range(n)]


def test_space_registry_lists_counts_and_finds_like_a_plain_one(pair):
    plain, spaced = pair
    assert list(spaced) == list(plain) and len(spaced) == len(plain)
    k = list(plain)[5]
    assert k in spaced and k.name in spaced and spaced.get(k.name) == k
    assert "gemm_nothing_like_this.x.numpy" not in spaced
    for p in _problems(random.Random(1)):
        assert spaced.candidates(p) == plain.candidates(p)


def test_filter_remove_merge_and_export(pair):
    plain, spaced = pair
    expr = "c.tile_m == 128 and c.pipeline != 'mem'"
    assert list(spaced.filter(expr)) == list(plain.filter(expr))
    k = list(plain)[3]
    spaced.remove(k)
    plain.remove(k)
    assert k not in spaced and len(spaced) == len(plain) and list(spaced) == list(plain)
    assert spaced.to_dict()["kernels"] == plain.to_dict()["kernels"]
    merged = spaced.merge(Registry(spaced.arch, [k]))
    assert k in merged and len(merged) == len(plain) + 1


def test_dispatcher_picks_the_same_over_either(pair):
    plain, spaced = pair
    a, b = Dispatcher(plain), Dispatcher(spaced)
    for p in _problems(random.Random(9), 5):
        assert a.select(p) == b.select(p)
