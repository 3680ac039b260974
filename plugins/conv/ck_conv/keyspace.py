"""The conv kernel space as a :class:`ck_core.keyspace.KeySpace`: expanded per signature, on demand.

A conv key is a signature (direction, dtype, spatial rank, layout family) and an
algorithm.  Which algorithms exist depends on the direction, the dtype and the
specialisation only (the arch's tile, LDS and shared-memory rules read neither the
rank nor the layout), so the space builds each (direction, dtype, specialisation)
list of algorithms once and pairs it with every rank and layout asked for.  A
problem fixes its signature: membership and a problem's candidates touch one list;
counting touches one list per (direction, dtype) and multiplies.
"""
from __future__ import annotations

import itertools

import attrs

from ck_core.errors import ConfigError
from ck_core.key import KernelKey
from ck_core.keyspace import KeySpace

from . import keys as K
from .keys import ConvSignature, from_config
from .space import OPTIONS, _splits, classic_configs, conv_facts, enumerate_configs, realisation_configs
from .problem import DIRECTIONS, DTYPES, LAYOUT_FAMILIES


def _as_list(v) -> list:
    return [v] if isinstance(v, (str, int)) else list(v)


class ConvSpace(KeySpace):
    """CK's grouped-conv tile space on ``arch`` and, for the triton backend, the Triton
    realisation families (:mod:`ck_conv.space`), each with its reduction splits.

    Arch facts for conv may sit in ``arch.extras["conv"]``: ``tiles``, ``depthwise_tiles``,
    ``waves`` (used where the arch lists no ``wave_layouts``) and ``max_block_threads``
    (:func:`ck_conv.space.conv_facts`; the defaults are CK's tables), ``pipelines`` and
    ``specializations``.  Archs whose pipelines are not CK's (sm90's ``multistage``) take
    CK's three, which the Triton kernels realise as 2/3/4-stage software pipelines.
    """

    op = "conv"

    def __init__(self, arch, backend: str, options: dict):
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise ConfigError(f"unknown conv enumeration option(s) {', '.join(unknown)}; "
                              f"known: {', '.join(OPTIONS)}")
        opts = {k: _as_list(v) for k, v in options.items()}
        for name, allowed in (("directions", DIRECTIONS), ("dtypes", DTYPES), ("layouts", tuple(LAYOUT_FAMILIES)),
                              ("ndims", (1, 2, 3)), ("specializations", K.SPECIALIZATIONS),
                              ("pipelines", K.PIPELINES)):
            bad = [v for v in opts.get(name, ()) if v not in allowed]
            if bad:
                raise ConfigError(f"conv option {name}: unknown value(s) {bad}; use {', '.join(map(str, allowed))}")
        facts = dict(getattr(arch, "extras", {}).get("conv", {}))
        self.split_ks = tuple(int(v) for v in opts.get("split_ks") or ())
        if any(v < 1 for v in self.split_ks):
            raise ConfigError(f"conv option split_ks: splits must be >= 1, got {list(self.split_ks)}")
        self.archspec, self.arch, self.backend = arch, arch.name, backend
        self.directions = tuple(dict.fromkeys(opts.get("directions") or DIRECTIONS))
        self.dtypes = tuple(d for d in dict.fromkeys(opts.get("dtypes") or DTYPES) if d in arch.dtypes)
        self.ndims = tuple(dict.fromkeys(int(n) for n in opts.get("ndims") or (1, 2, 3)))
        self.layouts = tuple(dict.fromkeys(opts.get("layouts") or ("nhwgc",)))
        self.specs = tuple(dict.fromkeys(opts.get("specializations") or facts.get("specializations")
                                         or K.SPECIALIZATIONS))
        self.pipes = tuple(opts.get("pipelines") or facts.get("pipelines")
                           or [p for p in K.PIPELINES if p in (arch.pipelines or K.PIPELINES)] or K.PIPELINES)
        self.facts = conv_facts(arch)
        self.tiles = tuple(tuple(t) for t in (opts.get("tiles") or self.facts["tiles"]))
        #: the options narrow the realisation families too
        self._only_tiles = {tuple(t) for t in opts.get("tiles") or ()}
        self._only_pipes = set(opts.get("pipelines") or ())
        self._algs: dict = {}
        self._split_algs: dict = {}
        self._holds: dict = {}   # key -> membership (a space never changes; shortlists ask again and again)

    # -- the algorithm lists ------------------------------------------------------
    def _lists(self, d: str, dt: str, spec: str) -> tuple:
        """(CK tile-space algorithms, realisation algorithms not among them) of one
        direction, dtype and specialisation, splits included, in enumeration order."""
        key = (d, dt, spec)
        got = self._algs.get(key)
        if got is None:
            got = self._algs[key] = self._build(d, dt, spec)
        return got

    def _build(self, d: str, dt: str, spec: str) -> tuple:
        arch = self.archspec
        nd, lay = self.ndims[0], self.layouts[0]   # any: the rules read neither
        ck = enumerate_configs(
            warp_size=arch.warp_size, lds_bytes=arch.lds_bytes, warp_tiles=dict(arch.warp_tiles),
            directions=(d,), dtypes=(dt,), ndims=(nd,), layouts=(lay,), tiles=self.tiles,
            waves=tuple(map(tuple, arch.wave_layouts)) or self.facts["waves"], pipelines=self.pipes,
            specializations=(spec,), depthwise_tiles=self.facts["depthwise_tiles"],
            max_threads=self.facts["max_block_threads"])
        extra = self._realisations(d, dt, nd, lay, spec) if self.backend == "triton" else []
        seen: set = set()
        return self._algorithms(ck, seen), self._algorithms(extra, seen)

    def _realisations(self, d, dt, nd, lay, spec) -> list:
        arch, out = self.archspec, []
        for c in classic_configs(d, dt, nd, lay, spec) + realisation_configs(d, dt, nd, lay, spec):
            if (self._only_tiles and c.tile not in self._only_tiles) or \
                    (self._only_pipes and c.pipeline not in self._only_pipes):
                continue
            # Triton realises a tile with num_warps warps whatever their layout: of CK's
            # rules only the thread count and the LDS hold (shared memory: below)
            if c.num_warps * arch.warp_size <= self.facts["max_block_threads"] and c.lds_bytes() <= arch.lds_bytes:
                out.append(c)
        return out

    def _algorithms(self, cfgs, seen: set) -> dict:
        """{unsplit algorithm: its splits} of the configs that fit the arch, in order."""
        arch = self.archspec
        nvidia, lds = getattr(arch, "vendor", "") == "nvidia", arch.lds_bytes
        out = {}
        for c in cfgs:
            if c in seen:
                continue
            seen.add(c)
            if nvidia and c.specialization != "depthwise":
                # Triton on NVIDIA keeps num_stages buffers of A and B in shared memory
                # (a group-merged bwd_weight one per merged group: a batched dot)
                need = (c.tile[0] + c.tile[1]) * c.tile[2] * K.ELEMENT_BYTES[c.dtype] * c.smem_buffers \
                    * (c.group_merge if c.direction == "bwd_weight" else 1)
                if need > lds:
                    continue
            # the split is a Triton realisation knob
            out[from_config(c)[1]] = _splits(c, self.split_ks) if self.backend == "triton" else (1,)
        return out

    def _signature_algs(self, d: str, dt: str, specs=None):
        for part in (0, 1):   # CK's tile space first, then the realisations (the order ranking ties keep)
            for s in specs or self.specs:
                yield from self._variants(d, dt, s, part)

    def _variants(self, d: str, dt: str, spec: str, part: int) -> list:
        """The algorithms of one list with every split (built when first listed, then kept)."""
        key = (d, dt, spec, part)
        got = self._split_algs.get(key)
        if got is None:
            got = self._split_algs[key] = [alg if sp == 1 else attrs.evolve(alg, split=sp)
                                           for alg, splits in self._lists(d, dt, spec)[part].items()
                                           for sp in splits]
        return got

    # -- KeySpace ------------------------------------------------------------------
    def __iter__(self):
        for d, dt, nd, lay in itertools.product(self.directions, self.dtypes, self.ndims, self.layouts):
            sig = ConvSignature(d, dt, nd, lay)
            for alg in self._signature_algs(d, dt):
                yield KernelKey("conv", sig, alg, self.arch, self.backend)

    def count(self) -> int:
        per = sum(len(splits) for d, dt, s in itertools.product(self.directions, self.dtypes, self.specs)
                  for part in self._lists(d, dt, s) for splits in part.values())
        return per * len(self.ndims) * len(self.layouts)

    def __contains__(self, key) -> bool:
        try:
            return self._holds[key]
        except (KeyError, TypeError):
            pass
        got = self._contains(key)
        if isinstance(key, KernelKey):
            if len(self._holds) > 65536:
                self._holds.clear()
            self._holds[key] = got
        return got

    def _contains(self, key) -> bool:
        if not isinstance(key, KernelKey) or key.op != "conv" or key.arch != self.arch \
                or key.backend != self.backend:
            return False
        sig, alg = key.signature, key.algorithm
        if sig.direction not in self.directions or sig.dtype not in self.dtypes or sig.ndim not in self.ndims \
                or sig.layout not in self.layouts or alg.specialization not in self.specs:
            return False
        ck, extra = self._lists(sig.direction, sig.dtype, alg.specialization)
        base = alg if alg.split == 1 else attrs.evolve(alg, split=1)
        splits = ck.get(base) or extra.get(base)
        return splits is not None and alg.split in splits

    def candidates(self, problem, supports) -> list:
        sig = ConvSignature(problem.direction, problem.dtype, problem.ndim, problem.layout_family)
        if sig.direction not in self.directions or sig.dtype not in self.dtypes or sig.ndim not in self.ndims \
                or sig.layout not in self.layouts:
            return []
        specs = [s for s in self.specs if _may_run(s, problem)]
        out = []
        for alg in self._signature_algs(sig.direction, sig.dtype, specs) if specs else ():
            k = KernelKey("conv", sig, alg, self.arch, self.backend)
            if supports(k, problem) is None:
                out.append(k)
        return out


def _may_run(spec: str, p) -> bool:
    """Whether kernels of specialisation ``spec`` can run ``p`` at all (``why_not`` refuses every
    other kernel of that specialisation, whatever its knobs)."""
    if spec == "depthwise":
        return p.c_per_group == 1 and p.k_per_group == 1
    if spec == "filter1x1_stride1_pad0":
        return p.specialization == spec
    if spec == "filter1x1_pad0":
        return p.specialization in ("filter1x1_pad0", "filter1x1_stride1_pad0")
    if spec == "filter3x3":
        return p.specialization == spec
    return True


def key_space(arch, backend: str, options: dict):
    """The conv kernel space on ``arch`` as a KeySpace (:class:`ConvSpace`)."""
    return ConvSpace(arch, backend, options)


def enumerate_keys(arch, backend: str, options: dict) -> list:
    """Every key of :func:`key_space`, listed."""
    return list(key_space(arch, backend, options))
