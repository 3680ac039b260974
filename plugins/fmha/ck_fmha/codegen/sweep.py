"""Tile-engine sweep configs: allow-lists over :class:`FmhaKernelSpec` fields.

A sweep config names a variant (which families) and, per trait, the values
that may pass; a trait that is absent lets everything through.  JSON, as the
CK tile engine writes it::

    {
      "variant": "fwd",
      "trait_config": {
        "data_type": {"values": ["fp16", "bf16"]},
        "pipeline":  {"values": ["qr_async"]},
        "mask":      {"values": ["no"]},
        "lse":       {"values": [false]}
      }
    }

or the same in TOML (``[trait_config]`` with ``data_type = { values = [...] }``
or the short form ``data_type = [...]``).  Optional top-level ``arch`` and
``receipt`` pick the enumeration the config applies to.

Trait keys are spec field names, plus the tile engine's spellings
(``data_type``, ``paged_kv``, ``skip_min_seqlen_q``, ``pad_s``/``pad_sk``/
``pad_d``/``pad_dv``, ``tile_m0``/``tile_n0``/``tile_k0``/``tile_n1``/
``tile_k1``/``tile_k0max``).  Every error names the file and the key.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Dict, FrozenSet, Iterable, List, Optional, Tuple, Union

import attrs

from ck_core.config import load_json, load_toml
from ck_core.errors import ConfigError

from . import ck_facts as F
from .enumerate import enumerate_kernels
from .spec import FAMILY_FIELDS, FmhaKernelSpec

# variant -> families (the tile engine's variants, plus every family by name)
VARIANTS: Dict[str, Tuple[str, ...]] = {
    "fwd": ("fwd",),
    "bwd": ("bwd_dot_do_o", "bwd_dq_dk_dv", "bwd_convert_dq"),
    "splitkv": ("fwd_splitkv", "fwd_splitkv_combine"),
    "pagedkv": ("fwd_pagedkv",),
    "appendkv": ("fwd_appendkv",),
    "batch_prefill": ("batch_prefill",),
    "all": F.FAMILIES,
}
VARIANTS.update({fam: (fam,) for fam in F.FAMILIES})

_TILE_INDEX = {"tile_m0": 0, "tile_n0": 1, "tile_k0": 2, "tile_n1": 3, "tile_k1": 4, "tile_k0max": 5}
_ALIASES = {
    "data_type": "dtype",
    "paged_kv": "pagedkv",
    "skip_min_seqlen_q": "skip",
    "pad_s": "spad",
    "pad_sk": "skpad",
    "pad_d": "dpad",
    "pad_dv": "dvpad",
    "gfx_arch": "arch",
}
_MASK_ALIASES = {"top_left": "causal", "bottom_right": "causal", "window_generic": "generic"}
_VOCAB: Dict[str, FrozenSet[str]] = {
    "family": frozenset(F.FAMILIES),
    "arch": frozenset(F.ARCHES),
    "dtype": frozenset(F.DTYPES),
    "mode": frozenset(F.MODES),
    "mask": frozenset(m for ms in F.MASKS.values() for m in ms),
    "bias": frozenset(F.BIASES),
    "pipeline": frozenset({"", "qr", "qr_async", "qs", "qr_async_trload", "qr_async_trload_v3",
                           "qr_pagedkv", "qr_nwarp_sshuffle", "appendkv"}),
    "qscale": frozenset(F.QSCALES),
    "rope": frozenset(F.ROPES),
    "kv_layout": frozenset(F.KV_LAYOUTS),
    "kv_lookup": frozenset(F.KV_LOOKUPS),
    "vlayout": frozenset({"row", "col"}),
}
_FIELDS = {f.name: f for f in attrs.fields(FmhaKernelSpec)}
_BOOL_FIELDS = frozenset(n for n, f in _FIELDS.items() if isinstance(f.default, bool))
_INT_FIELDS = frozenset({"hdim_q", "hdim_v", "occupancy", "max_seq_q", "dpad", "dvpad", "page_size"})
_TUPLE_FIELDS = frozenset({"tile", "warps", "warp_tile"})
TRAIT_KEYS: Tuple[str, ...] = tuple(sorted(set(_FIELDS) | set(_ALIASES) | set(_TILE_INDEX)))


def _norm_bool(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    if value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in ("t", "true", "f", "false"):
        return value.lower() in ("t", "true")
    raise ConfigError(f"{where}: expected true/false, got {value!r}")


def _norm_value(key: str, value: Any, where: str) -> Any:
    if key in _BOOL_FIELDS:
        return _norm_bool(value, where)
    if key in _INT_FIELDS or key in _TILE_INDEX:
        if key in ("dpad", "dvpad") and isinstance(value, bool):
            return int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if key in _TUPLE_FIELDS:
        if not isinstance(value, (list, tuple)) or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise ConfigError(f"{where}: expected a list of integers, got {value!r}")
        return tuple(value)
    if not isinstance(value, str):
        raise ConfigError(f"{where}: expected a string, got {value!r}")
    if key == "mask":
        value = _MASK_ALIASES.get(value, value)
    vocab = _VOCAB.get(key)
    if vocab is not None and value not in vocab:
        raise ConfigError(f"{where}: unknown value {value!r}; valid values: {sorted(vocab)}")
    return value


def _getter(key: str) -> Callable[[FmhaKernelSpec], Any]:
    if key in _TILE_INDEX:
        i = _TILE_INDEX[key]
        return lambda s: s.tile[i] if len(s.tile) > i else None
    return lambda s: getattr(s, key)


def _field_of(key: str) -> str:
    return "tile" if key in _TILE_INDEX else key


@attrs.frozen
class SweepConfig:
    """A parsed sweep config: which families, and an allow-list per trait."""

    source: str
    variant: str
    families: Tuple[str, ...]
    traits: Tuple[Tuple[str, FrozenSet[Any]], ...] = ()
    arch: Optional[str] = None
    receipt: Optional[int] = None

    def _checks(self, family: str):
        # A trait a family does not have (e.g. bias on the combine kernel)
        # does not filter that family.
        return [(_getter(key), allowed) for key, allowed in self.traits
                if _field_of(key) in FAMILY_FIELDS[family]]

    def matches(self, spec: FmhaKernelSpec) -> bool:
        if spec.family not in self.families:
            return False
        return all(g(spec) in allowed for g, allowed in self._checks(spec.family))

    def apply(self, specs: Iterable[FmhaKernelSpec]) -> List[FmhaKernelSpec]:
        """The specs the config allows, in their original order."""
        checks = {fam: self._checks(fam) for fam in self.families}
        out = []
        for s in specs:
            c = checks.get(s.family)
            if c is not None and all(g(s) in allowed for g, allowed in c):
                out.append(s)
        return out

    def enumerate(self, arch: Optional[str] = None, receipt: Optional[int] = None,
                  **kwargs) -> List[FmhaKernelSpec]:
        """Enumerate the config's families and filter them.

        ``arch``/``receipt`` override the config's; with neither, the arch is
        an error and the receipt defaults to 0.
        """
        arch = arch or self.arch
        if arch is None:
            raise ConfigError(f"{self.source}: no arch given; set 'arch' in the config or pass arch=")
        rec = self.receipt if receipt is None else receipt
        rec = 0 if rec is None else rec
        return self.apply(enumerate_kernels(arch, rec, self.families, **kwargs))


def parse_sweep(data: Any, source: str = "<config>") -> SweepConfig:
    """Build a :class:`SweepConfig` from already-loaded JSON/TOML data."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a sweep config must be a table/object at top level")
    unknown = set(data) - {"variant", "trait_config", "arch", "receipt", "description", "name"}
    if unknown:
        raise ConfigError(
            f"{source}: unknown top-level key(s) {sorted(unknown)}; valid keys: "
            "variant, trait_config, arch, receipt, description, name"
        )
    variant = data.get("variant")
    if variant not in VARIANTS:
        raise ConfigError(
            f"{source}: key 'variant' = {variant!r} is not a valid variant; "
            f"choose one of {sorted(VARIANTS)}"
        )
    arch = data.get("arch")
    if arch is not None and arch not in F.ARCHES:
        raise ConfigError(f"{source}: key 'arch' = {arch!r}; valid arches: {', '.join(F.ARCHES)}")
    receipt = data.get("receipt")
    if receipt is not None and (isinstance(receipt, bool) or receipt not in F.RECEIPTS):
        raise ConfigError(
            f"{source}: key 'receipt' = {receipt!r}; valid receipts: {sorted(F.RECEIPTS)}"
        )
    trait_cfg = data.get("trait_config", {})
    if not isinstance(trait_cfg, dict):
        raise ConfigError(f"{source}: key 'trait_config' must be a table/object of traits")
    traits = []
    for raw_key, entry in trait_cfg.items():
        where = f"{source}: trait_config.{raw_key}"
        key = _ALIASES.get(raw_key, raw_key)
        if key not in _FIELDS and key not in _TILE_INDEX:
            raise ConfigError(f"{where}: unknown trait; valid traits: {', '.join(TRAIT_KEYS)}")
        if isinstance(entry, dict):
            extra = set(entry) - {"values"}
            if extra or "values" not in entry:
                raise ConfigError(f"{where}: expected {{\"values\": [...]}}, got keys {sorted(entry)}")
            values = entry["values"]
        else:
            values = entry
        if not isinstance(values, list):
            raise ConfigError(f"{where}: 'values' must be a list, got {values!r}")
        allowed = frozenset(_norm_value(key, v, f"{where}.values[{i}]") for i, v in enumerate(values))
        traits.append((key, allowed))
    return SweepConfig(source=source, variant=variant, families=VARIANTS[variant],
                       traits=tuple(traits), arch=arch, receipt=receipt)


def load_sweep(path: Union[str, Path]) -> SweepConfig:
    """Load a sweep config from a ``.json`` or ``.toml`` file."""
    path = Path(path)
    if not os.path.lexists(path):   # a FIFO, a folder, ...: ck_core.config says what it is
        raise ConfigError(f"{path}: sweep config file not found")
    suffix = path.suffix.lower()
    # ck_core.config reads both with the same guards (size, encoding, nesting depth)
    if suffix == ".toml":
        data = load_toml(path)
    elif suffix == ".json":
        data = load_json(path)
    else:
        raise ConfigError(f"{path}: unknown config format {suffix!r}; use .json or .toml")
    return parse_sweep(data, str(path))


def apply_sweep(config: Union[SweepConfig, str, Path], specs: Iterable[FmhaKernelSpec]) -> List[FmhaKernelSpec]:
    """Filter ``specs`` through a config (or a config file path)."""
    if not isinstance(config, SweepConfig):
        config = load_sweep(config)
    return config.apply(specs)
