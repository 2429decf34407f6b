"""Reading a GGUF's metadata back into config.json, for every family whose entry in gguf/families.py says how
llama.cpp wrote it (`Gguf`: the architecture name, the family's own fields, the tensor fixes).
Here: typed reads of the metadata (`Meta`), the fields every family has (sizes, heads, context, vocabulary,
tying, RoPE base and scaling, with llama.cpp's own defaults where a key is optional, since those are what the
file means to the program that made it), Llama 3's rope_freqs and Phi-3's longrope factors turned back into
config fields, and the GGUF name of each of the family's tensors (from the `gguf` package's own table).

Nothing here names a family: adding one is an entry in checkpoint/families.py and one in gguf/families.py.
"""
from __future__ import annotations

import math
import numpy as np

from ..checkpoint.families import FAMILIES
from .families import GGUF
from ..errors import MinigenError, is_int, is_number, short

_MAX_DIM = 2**31 - 1  # ggml's dims are int64, but nothing real is near this; larger means a damaged file


class Meta:
    """Typed reads of GGUF metadata, each error naming the file and the key. `m.int("block_count")` reads
    `{arch}.block_count`; keys with a dot-separated prefix of their own (`tokenizer.ggml.*`) go through `raw`."""

    def __init__(self, raw: dict, arch: str, source):
        self.raw, self.arch, self.source = raw, arch, source

    def _value(self, key: str, default, check, what: str):
        full = f"{self.arch}.{key}"
        if full not in self.raw:
            if default is ...:
                raise MinigenError(f"{self.source}: metadata key {full} is missing")
            return default
        value = self.raw[full]
        if isinstance(value, list):
            raise MinigenError(f"{self.source}: metadata key {full} is a per-layer list; minigen needs one value "
                               f"for every layer")
        if not check(value):
            raise MinigenError(f"{self.source}: metadata key {full} should be {what}, got {short(value)}")
        return value

    def has(self, key: str) -> bool:
        return f"{self.arch}.{key}" in self.raw

    def int(self, key: str, default=..., minimum: int = 1) -> int:
        return self._value(key, default, lambda v: is_int(v) and minimum <= v <= _MAX_DIM,
                           f"an integer from {minimum} to {_MAX_DIM}")

    def float(self, key: str, default=...) -> float:
        v = self._value(key, default, lambda v: is_number(v) and math.isfinite(v) and v > 0, "a positive number")
        return v if v is None else _f32(v)

    def bool(self, key: str, default=...) -> bool:
        return self._value(key, default, lambda v: isinstance(v, bool), "true or false")

    def str(self, key: str, default=...) -> str:
        return self._value(key, default, lambda v: isinstance(v, str), "a string")

    def layers(self) -> int:
        """block_count without the multi-token-prediction blocks llama.cpp appends (nextn_predict_layers: Qwen3.5's
        MTP head), which transformers does not run either; convert drops their tensors."""
        n = self.int("block_count")
        extra = self.int("nextn_predict_layers", default=0, minimum=0)
        if extra >= n:
            self.fail("nextn_predict_layers", f"({extra}) leaves none of the {n} blocks (block_count) to run")
        return n - extra

    def head_counts_kv(self) -> list[int]:
        """attention.head_count_kv for each layer: one value, or a per-layer list (0 on a recurrent layer, for a
        family whose entry says so: LFM2, Granite 4.0-H)."""
        value, n = self.raw.get(f"{self.arch}.attention.head_count_kv"), self.layers()
        if not isinstance(value, list) or not gguf_of(self.arch).recurrent:  # a list: refused by name
            return [self.int("attention.head_count_kv", default=self.int("attention.head_count"))] * n
        if len(value) < n or not all(is_int(v) and 0 <= v <= _MAX_DIM for v in value):
            self.fail("attention.head_count_kv", f"should list a head count for each of the {n} layers")
        counts = list(value[:n])
        if len({v for v in counts if v}) > 1:
            self.fail("attention.head_count_kv", f"differs between attention layers ({short(counts)}); minigen "
                                                 f"needs one count")
        return counts

    def fail(self, key: str, why: str):
        raise MinigenError(f"{self.source}: metadata key {self.arch}.{key} {why}")

    def sliding_pattern(self, n_layers: int, default: int) -> list[str]:
        """llama.cpp's load_swa_pattern: a per-layer bool list, or a period n (layer i slides unless
        (i+1) % n == 0; 0: every layer slides), as config.json's layer_types."""
        key = f"{self.arch}.attention.sliding_window_pattern"
        value = self.raw.get(key, default)
        if isinstance(value, list):
            if len(value) != n_layers or not all(isinstance(v, (bool, int)) for v in value):
                self.fail("attention.sliding_window_pattern", f"should list one flag for each of the {n_layers} layers")
            flags = [bool(v) for v in value]
        elif is_int(value) and 0 <= value <= _MAX_DIM:
            flags = [value == 0 or (i + 1) % value != 0 for i in range(n_layers)]
        else:
            self.fail("attention.sliding_window_pattern",
                      f"should be a layer count or a list of flags, got {short(value)}")
        return ["sliding_attention" if f else "full_attention" for f in flags]

    def rope_scaling(self) -> dict | None:
        """rope.scaling.* as HF's rope_scaling (linear_rope), for a family reader that places it itself
        (OLMo 3: on its full layers only)."""
        return linear_rope(self, gguf_of(self.arch))


class Tensors:
    """The GGUF's tensor names and shapes (GGUF order: innermost dimension first), for config decisions."""

    def __init__(self, shapes: dict[str, tuple]):
        self.shapes = shapes

    def has(self, name: str) -> bool:
        return name in self.shapes

    def any(self, local: str) -> bool:
        """Whether some layer has the tensor blk.N.<local> ("ssm_conv1d.bias")."""
        return any(name.startswith("blk.") and name.split(".", 2)[-1] == local for name in self.shapes)


# --- the config.json fields each architecture's metadata gives ------------------------------------------

def common(m: Meta, t: Tensors, arch) -> dict:
    """The fields every family has: sizes, heads, context, vocabulary, tying, RoPE base and scaling."""
    hidden = m.int("embedding_length")
    n_head = m.int("attention.head_count")
    n_kv = max(m.head_counts_kv()) or n_head  # a per-layer list: the attention layers' count
    if n_head % n_kv:
        m.fail("attention.head_count_kv", f"({n_kv}) does not divide attention.head_count ({n_head})")
    head_dim = m.int("attention.key_length", default=None)
    if head_dim is None:
        if hidden % n_head:
            m.fail("attention.head_count", f"({n_head}) does not divide embedding_length ({hidden}) and there "
                                           f"is no attention.key_length")
        head_dim = hidden // n_head
    if m.int("attention.value_length", default=head_dim) != head_dim:
        m.fail("attention.value_length", f"differs from attention.key_length ({head_dim}); minigen needs them equal")
    embed = t.shapes.get("token_embd.weight")
    if embed is None or len(embed) != 2:
        raise MinigenError(f"{m.source}: no two-dimensional token_embd.weight tensor")
    vocab = embed[1]
    if m.int("vocab_size", default=vocab) != vocab:
        m.fail("vocab_size", f"({m.raw[m.arch + '.vocab_size']}) differs from the rows of token_embd.weight ({vocab})")
    rope_dims = m.int("rope.dimension_count", default=head_dim)
    if rope_dims > head_dim or rope_dims % 2 or (arch.rope_dims == "full" and rope_dims != head_dim):
        m.fail("rope.dimension_count", f"({rope_dims}) should be {'at most ' if arch.rope_dims != 'full' else ''}"
                                       f"the head dimension ({head_dim}) and even")
    return {
        "hidden_size": hidden,
        "num_hidden_layers": m.layers(),
        "intermediate_size": m.int("feed_forward_length"),
        "num_attention_heads": n_head,
        "num_key_value_heads": n_kv,
        "head_dim": head_dim,
        "max_position_embeddings": m.int("context_length"),
        "vocab_size": vocab,
        "tie_word_embeddings": not t.has("output.weight"),
        "rope_theta": m.float("rope.freq_base", default=10000.0),  # llama.cpp's default when absent
        "rope_scaling": linear_rope(m, arch),
        "_rope_dims": rope_dims,  # popped by convert: what partial_rotary_factor is computed from
    }


def linear_rope(m: Meta, arch) -> dict | None:
    """llama.cpp's rope.scaling.type (default none) and its parameters, as HF's rope_scaling; longrope only
    for a family whose factors llama.cpp writes as tensors (`Gguf.rope_factors`)."""
    kind = m.str("rope.scaling.type", default="none")
    factor = m.float("rope.scaling.factor", default=None) or m.float("rope.scale_linear", default=None)
    if kind == "none" or (kind == "linear" and factor in (None, 1.0)):
        return None
    if kind == "linear":
        return {"rope_type": "linear", "type": "linear", "factor": factor}
    if kind == "yarn":
        return yarn_rope(m, factor)
    if kind == "longrope" and arch.rope_factors == "longrope":
        return None  # phi3: the factors are tensors, read by `longrope` below
    m.fail("rope.scaling.type", f"is {kind!r}, which minigen does not run (it runs none, linear, yarn, Llama 3's "
                                f"rope_freqs and Phi-3's longrope)")


def yarn_rope(m: Meta, factor: float | None) -> dict:
    """HF's YaRN settings from what convert_hf_to_gguf.py wrote: the factor, the original context, the betas
    and attention factor when the source had them, and yarn_log_multiplier (Ministral 3's mscale_all_dim;
    llama.cpp takes mscale as 1 beside it, and so does this)."""
    if factor is None:
        m.fail("rope.scaling.factor", "is missing, and YaRN needs it")
    out = {"rope_type": "yarn", "type": "yarn", "factor": factor,
           "original_max_position_embeddings": m.int("rope.scaling.original_context_length")}
    for key, name in (("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow"),
                      ("yarn_attn_factor", "attention_factor")):
        value = m.float(f"rope.scaling.{key}", default=None)
        if value is not None:
            out[name] = value
    log_mul = m.float("rope.scaling.yarn_log_multiplier", default=None)
    if log_mul is not None:
        out.update(mscale=1.0, mscale_all_dim=log_mul)
    return out


# --- Llama 3's rope_freqs and Phi-3's longrope factors: tensors back to config fields --------------------

def llama3_rope(factors: np.ndarray, theta: float, dim: int, source) -> dict | None:
    """HF's llama3 rope_scaling that gives llama.cpp's per-frequency `rope_freqs` factors (llama.cpp divides
    frequency i by factors[i]), or None when every factor is 1. llama.cpp computed them from (factor,
    low_freq_factor, high_freq_factor, original_max_position_embeddings); the tensor alone does not pin all
    four, so candidates are tried (Llama 3.x's low_freq_factor of 1, the rest fitted to the blended factors or
    a power-of-two original context) and the first whose factors match the tensor to float32 precision wins:
    any such set gives the same frequencies, hence the same RoPE.""" 
    factors = np.asarray(factors, np.float64)
    if factors.shape != (dim // 2,) or not np.all(np.isfinite(factors)) or np.any(factors <= 0):
        raise MinigenError(f"{source}: tensor rope_freqs.weight should hold {dim // 2} positive factors")
    if np.allclose(factors, 1.0, rtol=0, atol=1e-6):
        return None
    freqs = 1.0 / theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    wavelen = 2 * math.pi / freqs
    for params in _llama3_candidates(factors, wavelen):
        if np.allclose(_llama3_factors(wavelen, **params), factors, rtol=2e-6, atol=0):
            return {"rope_type": "llama3", "type": "llama3", **params}
    raise MinigenError(f"{source}: tensor rope_freqs.weight holds RoPE factors that are not Llama 3's scaling "
                       f"(no factor, low/high_freq_factor and original context reproduce them); cannot convert")


def _llama3_factors(wavelen, factor, low_freq_factor, high_freq_factor, original_max_position_embeddings):
    """llama.cpp's generate_extra_tensors for llama3 rope (conversion/llama.py), in float64."""
    old = original_max_position_embeddings
    smooth = (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    mid = 1 / ((1 - smooth) / factor + smooth)
    return np.where(wavelen < old / high_freq_factor, 1.0, np.where(wavelen > old / low_freq_factor, factor, mid))


def _llama3_candidates(factors, wavelen):
    """(factor, low, high, original) sets to try, all with low_freq_factor 1 (every Llama 3.x release)."""
    factor = float(np.float32(factors.max()))
    mid = (factors > 1 + 1e-6) & (factors < factor * (1 - 1e-6))
    smooth = (1 / factors[mid] - 1 / factor) / (1 - 1 / factor)  # = (old / wavelen - 1) / (high - 1)
    if mid.sum() >= 2:  # smooth is linear in 1 / wavelen: fit it
        a, b = np.polyfit(1 / wavelen[mid], smooth, 1)
        if b < 0:
            yield _params(factor, 1.0, 1 - 1 / b, a * -1 / b)
    for old in [8192] + [2 ** k for k in range(1, 25)]:  # a power-of-two original context, high from one blend
        if mid.any():
            yield _params(factor, 1.0, 1 + (old / wavelen[mid][0] - 1) / smooth[0], old)
        else:
            yield _params(factor, 1.0, 4.0, old)
    ones, scaled = wavelen[factors <= 1 + 1e-6], wavelen[factors >= factor * (1 - 1e-6)]
    if not mid.any() and len(ones) and len(scaled):  # no blended frequencies: any band edge between the two works
        old = float(scaled.min()) * 0.999
        yield _params(factor, 1.0, old / (float(ones.max()) * 1.001), old)


def _params(factor, low, high, old) -> dict:
    return {"factor": factor, "low_freq_factor": float(low), "high_freq_factor": float(round(high, 6)),
            "original_max_position_embeddings": int(round(old))}


def longrope(short: np.ndarray, long: np.ndarray, m: Meta, pairs: int) -> dict:
    """Phi-3's rope_scaling from llama.cpp's rope_factors_short/long tensors and its attention factor."""
    for name, f in (("rope_factors_short", short), ("rope_factors_long", long)):
        if f is None or f.shape != (pairs,) or not np.all(np.isfinite(f)) or np.any(f <= 0):
            raise MinigenError(f"{m.source}: tensor {name}.weight should hold {pairs} positive factors "
                               f"(Phi-3 longrope needs both)")
    out = {"rope_type": "longrope", "type": "longrope", "short_factor": [_f32(x) for x in short],
           "long_factor": [_f32(x) for x in long]}
    attn = m.float("rope.scaling.attn_factor", default=None)
    if attn is not None:
        out["attention_factor"] = attn
    return out


# --- the families, by GGUF architecture ---------------------------------------------------------------------

ARCHS = {g.arch: name for name, g in GGUF.items()}  # "gemma3" -> "gemma3_text"
assert len(ARCHS) == len(GGUF), "two families claim one GGUF architecture"
assert set(GGUF) <= set(FAMILIES), "a GGUF entry for a family minigen does not have"


def family_of(arch_name: str):
    """The family (checkpoint/families.py) llama.cpp's architecture `arch_name` is written from."""
    return FAMILIES[ARCHS[arch_name]]


def gguf_of(arch_name: str):
    """How llama.cpp writes that family (gguf/families.py)."""
    return GGUF[ARCHS[arch_name]]


def family_config(arch_name: str, m: Meta, t: Tensors) -> dict:
    """config.json (HF field names, the spelling both transformers 4.x and 5.x read) for this GGUF."""
    arch = gguf_of(arch_name)
    cfg = {"architectures": [arch.hf_class], "model_type": ARCHS[arch_name], **common(m, t, arch)}
    cfg.update(arch.config(m, t))
    rope_dims = cfg.pop("_rope_dims")
    if rope_dims != cfg["head_dim"]:
        cfg["partial_rotary_factor"] = rope_dims / cfg["head_dim"]
    if "llama_4_scaling_beta" in cfg:  # Ministral 3 keeps it among the RoPE settings
        cfg["rope_scaling"]["llama_4_scaling_beta"] = cfg.pop("llama_4_scaling_beta")
    return arch.spell({k: v for k, v in cfg.items() if not (k in ("rope_theta", "rope_scaling") and v is None
                                                            and "rope_parameters" in cfg)})


# --- tensor names, from the gguf package's table -------------------------------------------------------------

def tensor_names(arch_name: str, family, n_layers: int) -> dict[str, tuple[str, str, int]]:
    """GGUF tensor name -> (the family's HF tensor name, its canonical name, which part of it: 0, or 1 for the
    second of two tensors llama.cpp split it into), for every tensor the family can have. From the gguf package's
    table, but where the family's entry names the GGUF tensor itself (`Gguf.tensors`; a list there: alternatives,
    each GGUF name of them mapped to the same HF tensor)."""
    import gguf

    tmap = gguf.get_tensor_name_map(_gguf_arch(arch_name), n_layers)
    own = gguf_of(arch_name).tensors
    names = {}
    for key, templates in family.tensors.items():
        for template in templates if isinstance(templates, tuple) else (templates,):
            for i in (range(n_layers) if "{}" in template else (None,)):
                hf = template.format(i) if i is not None else template
                if key in own:
                    for alternative in own[key] if isinstance(own[key], list) else [own[key]]:
                        locals_ = alternative if isinstance(alternative, tuple) else (alternative,)
                        for part, local in enumerate(locals_):
                            names.setdefault(local if i is None else f"blk.{i}.{local}", (hf, key, part))
                    continue
                g = tmap.get_name(hf, try_suffixes=(".weight", ".bias"))
                if g is not None:
                    names.setdefault(g, (hf, key, 0))
    return names


def _gguf_arch(name: str):
    import gguf

    return next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == name)


def local(gguf_name: str) -> str:
    """'blk.3.ssm_conv1d.weight' -> 'ssm_conv1d.weight'; a global name as it is."""
    parts = gguf_name.split(".", 2)
    return parts[2] if parts[0] == "blk" and len(parts) > 2 else gguf_name


def kind(gguf_name: str) -> str:
    """'blk.3.attn_q.weight' -> 'attn_q'; 'output_norm.weight' -> 'output_norm'."""
    parts = gguf_name.split(".")
    if parts[0] == "blk" and len(parts) > 2:
        parts = parts[2:]
    return ".".join(parts[:-1]) if parts[-1] in ("weight", "bias") else ".".join(parts)


# --- the fixes: checkpoint/fixes.FIXES ---------------------------------------------------------------------------

def fix_of(arch_name: str, gguf_name: str) -> str | None:
    """The FIXES name the architecture's entry gives this GGUF tensor: by its name without "blk.N."
    ("ssm_conv1d.weight"), else by its kind ("attn_q": weight and bias alike)."""
    fixes = gguf_of(arch_name).fixes
    return fixes.get(local(gguf_name)) or fixes.get(kind(gguf_name))


def fixed_shape(fix: str | None, shape: tuple) -> tuple:
    """The HF shape of a tensor whose GGUF shape (reversed to (out, in), a vector as (n,)) is `shape`."""
    if fix == "conv1d":
        return shape[::-1]
    if fix in ("channels", "dn_conv") and len(shape) == 2:
        return (shape[0], 1, shape[1])  # torch's depthwise Conv1d weight (C, 1, K)
    if fix in ("vector", "a_log", "dn_a_log"):
        return (int(np.prod(shape)),)
    return shape


# --- small helpers ------------------------------------------------------------------------------------------

def _f32(x: float) -> float:
    """A float32 metadata value as the shortest decimal that round-trips (9.999999747e-06 -> 1e-05)."""
    return float(np.format_float_positional(np.float32(x), unique=True, trim="-"))
