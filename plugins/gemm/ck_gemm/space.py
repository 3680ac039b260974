"""The GEMM kernel space: which keys exist for an arch and backend.

The CK-style product of the arch's tile table (``arch.extras['gemm']``), culled by the rules
of :mod:`ck_gemm.keys` (tile facts, CK Tile's warp-size rules, the Triton template's shared
memory on the triton backend), plus the arch's measured winners on the triton backend.

Option ``variants`` names CK's kernel sets (its codegen's ``--variants``): ``standard`` (the
default: C = A @ B with the epilogue options given), ``multi_d`` (fused D tensors: the
``num_ds`` given, else 1 and 2) and ``preshuffle`` (B pre-shuffled in the kernel's tile order:
rcr, every dimension padded, the variants of :data:`ck_gemm.keys.PRESHUFFLE_VARIANTS`).
"""
from __future__ import annotations

import itertools
import logging

import attrs

from ck_core.dtypes import ELEMENT_BYTES
from ck_core.errors import ConfigError
from ck_core.key import KernelKey

from . import ck_rules
from .keys import (EPILOGUES, PRESHUFFLE_BACKENDS, SCHEDULERS, GemmAlgorithm, GemmSignature, _tile_violation,
                   preshuffle_violation, rules_violation, split_violation, streamk_violation, triton_smem_violation,
                   twin_fits, variant_violation, warp_tiles_for)
from .problem import ACTIVATIONS, D_OPS, DTYPES, LAYOUTS

log = logging.getLogger(__name__)

OPTIONS = ("dtypes", "layouts", "tiles_mn", "pipelines", "epilogues", "pads", "num_ds", "d_ops",
           "activations", "split_ks", "dtypes_c", "variants")
#: CK's GEMM kernel sets (option ``variants``)
KERNEL_SETS = ("standard", "preshuffle", "multi_d")


def enumerate_keys(arch, backend: str, options: dict, tuned=None) -> list[KernelKey]:
    """CK-style kernel space on ``arch`` (tile table from ``arch.extras['gemm']``).

    ``tuned(arch, backend, dtypes, layouts)`` adds measured winners on the triton backend (the
    registry's enumeration, ``ck_gemm.heuristics.enumerate_keys``, passes the tuned-data reader)."""
    facts = dict(arch.extras.get("gemm", {}))
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ConfigError(f"unknown gemm enumeration option(s) {', '.join(unknown)}; "
                          f"known: {', '.join(OPTIONS)}")
    options = {k: ([v] if isinstance(v, (str, int)) else list(v)) for k, v in options.items()}
    for name, allowed in (("dtypes", DTYPES), ("layouts", LAYOUTS), ("num_ds", (0, 1, 2, 3, 4)),
                          ("d_ops", D_OPS), ("activations", ACTIVATIONS), ("variants", KERNEL_SETS)):
        bad = [v for v in options.get(name, ()) if v not in allowed]
        if bad:
            raise ConfigError(f"gemm option {name}: unknown value(s) {bad}; use {', '.join(allowed)}")
    dtypes = options.get("dtypes") or [d for d in DTYPES if d in arch.dtypes]
    layouts = options.get("layouts") or LAYOUTS
    tiles_mn = options.get("tiles_mn") or facts.get("tiles_mn") or (64, 128, 256)
    tile_k_bytes = facts.get("tile_k_bytes", (64, 128))
    pipelines = options.get("pipelines") or facts.get("pipelines") or arch.pipelines
    schedulers = facts.get("schedulers", SCHEDULERS)
    epilogues = options.get("epilogues") or facts.get("epilogues", EPILOGUES)
    pads = options.get("pads") or facts.get("pads", ((False, False, False), (True, True, True)))
    stages_opts = facts.get("stages", (0,))
    variants = facts.get("variants", ("tile",))
    split_ks = [int(v) for v in options.get("split_ks") or (1,)]
    if any(v < 1 for v in split_ks):
        raise ConfigError(f"gemm option split_ks: factors must be >= 1, got {split_ks}")
    # the arch's own split-K keys (unless the caller names factors): for problems with too few
    # output tiles to fill the machine, so only on the variants and C tile sizes it lists
    arch_split = facts.get("split_k") if not options.get("split_ks") else None
    if arch_split:
        split_ks = sorted({1, *(int(v) for v in arch_split.get("factors", ()))})
    # fused epilogues (multi-D, activation): one signature per combination; D ops only matter with Ds
    dtypes_c = options.get("dtypes_c") or [""]  # "" = CK's C dtype for the input dtype
    def epilogues_of(num_ds):
        return [(nd, op, act) for nd in num_ds
                for op in ((options.get("d_ops") or ("add",)) if nd else ("add",))
                for act in options.get("activations") or ("none",)]

    sets = options.get("variants") or ["standard"]
    std = epilogues_of(options.get("num_ds") or (0,))
    multi_d = epilogues_of([n for n in options.get("num_ds") or () if n] or (1, 2))
    # the plain-B signatures' epilogues: the standard set's, then multi-D's (in that order, once)
    epis = list(dict.fromkeys((std if "standard" in sets else []) + (multi_d if "multi_d" in sets else [])))
    # pre-shuffled B: the standard set's epilogues (each set is enumerated on its own, as CK's codegen does)
    ps_epis = std if "preshuffle" in sets and backend in PRESHUFFLE_BACKENDS else []
    ck = arch.vendor == "amd"
    out = []
    for dtype in dtypes:
        eb = ELEMENT_BYTES[dtype]
        sig_list = [GemmSignature(dtype, lay, dc, num_d=nd, d_op=op, activation=act)
                    for lay in layouts for dc in dtypes_c for nd, op, act in epis]
        sig_list += [GemmSignature(dtype, "rcr", dc, num_d=nd, d_op=op, activation=act, preshuffle=True)
                     for dc in dtypes_c for nd, op, act in ps_epis if "rcr" in layouts]
        if not sig_list:
            continue
        tks = sorted({tb // eb for tb in tile_k_bytes})
        for tm, tn, tk, wave, wt, pipe, sched, epi, pad, st, var, sk in itertools.product(
                tiles_mn, tiles_mn, tks, arch.wave_layouts, warp_tiles_for(arch, dtype),
                pipelines, schedulers, epilogues, pads, stages_opts, variants, split_ks):
            alg = GemmAlgorithm(tm, tn, tk, *wave, *wt, pipeline=pipe, scheduler=sched,
                                epilogue=epi, pad_m=pad[0], pad_n=pad[1], pad_k=pad[2],
                                stages=st, variant=var, split_k=sk)
            why = _tile_violation(sig_list[0], alg, arch) or variant_violation(alg) \
                or (arch_split and split_violation(alg, arch_split)) \
                or streamk_violation(alg, facts.get("streamk"))
            if why is None and backend == "triton":
                why = triton_smem_violation(dtype, alg, arch)
            if why:
                if log.isEnabledFor(logging.DEBUG):
                    log.debug("culled gemm %s %s: %s", dtype, alg, why)
                continue
            for sig in sig_list:
                # CK's load-cover rule depends on the layout: check every signature
                why = ck and ck_rules.violation(sig, alg, arch.name, arch.warp_size) \
                    or preshuffle_violation(sig, alg)
                if why:
                    if log.isEnabledFor(logging.DEBUG):
                        log.debug("culled gemm %s %s %s: %s", dtype, sig.layout, alg, why)
                    continue
                out.append(KernelKey("gemm", sig, alg, arch.name, backend))
    if backend == "triton" and tuned is not None:
        winners = tuned(arch, backend, dtypes, layouts)
        # (with every epilogue whose staging still fits: a fused D tensor or a wider C can tip a
        # winner at the limit over it)
        out.extend(attrs.evolve(k, signature=sig) for k in winners
                   for sig in [attrs.evolve(k.signature, dtype_c=dc, num_d=nd, d_op=op, activation=act)
                               for dc in dtypes_c for nd, op, act in epis]
                   if twin_fits(sig, k.algorithm, arch))
        # their pre-shuffled twins (rcr, pointer variants, split-K on the tile variant): the
        # heuristic's tuned-table pick then finds its config among the pre-shuffled keys too, so
        # a packed weight runs the tile, split and pipeline depth the plain weight would
        have = set(out)
        twins = [attrs.evolve(k, signature=sig) for k in winners if k.signature.layout == "rcr"
                 for sig in [attrs.evolve(k.signature, dtype_c=dc, num_d=nd, d_op=op, activation=act,
                                          preshuffle=True) for dc in dtypes_c for nd, op, act in ps_epis]
                 if preshuffle_violation(sig, k.algorithm) is None and twin_fits(sig, k.algorithm, arch)]
        out.extend(t for t in dict.fromkeys(twins) if t not in have)
    return out


def algorithm_for_config(cfg, arch, dtype: str, pipeline: str, layout: str = "rcr") -> GemmAlgorithm | None:
    """The legal CK-style algorithm record of a Triton config on ``arch`` (None if none fits).

    Of the (wave layout, warp tile) pairs that tile the block, the first the
    arch accepts wins (e.g. sm90 wants its wgmma tile, not an mma.sync one).
    """
    sig = GemmSignature(dtype, layout)
    for wave in arch.wave_layouts:
        if wave[0] * wave[1] * wave[2] != cfg.num_warps:
            continue
        for wt in arch.warp_tiles.get(dtype, ()):
            if cfg.block_m % (wave[0] * wt[0]) or cfg.block_n % (wave[1] * wt[1]) \
                    or cfg.block_k % (wave[2] * wt[2]):
                continue
            alg = GemmAlgorithm(cfg.block_m, cfg.block_n, cfg.block_k, *wave, *wt,
                                pipeline=pipeline, pad_m=True, pad_n=True, pad_k=True,
                                split_k=cfg.split_k, stages=cfg.num_stages,
                                variant="tile" if cfg.variant == "plain" else cfg.variant,
                                group_m=cfg.group_m, epi_subtile=cfg.epi_subtile)
            if rules_violation(sig, alg, arch) is None and \
                    arch.reject(KernelKey("gemm", sig, alg, arch.name, "triton")) is None:
                return alg
    return None
