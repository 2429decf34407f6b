"""Parity fixtures of issue 19's families: Granite, GraniteMoE, OLMo 3, Ministral 3, YaRN, and the text half
of the multimodal wrappers (Gemma 3, Mistral 3). Needs torch + transformers; minigen does not.

    /root/ref/bin/python scripts/make_family_fixtures.py              # all of them
    /root/ref/bin/python scripts/make_family_fixtures.py granite olmo3
    /root/ref/bin/python scripts/make_family_fixtures.py yarn          # yarn_frequencies.json only

The machinery is make_fixtures.py's (tokenizers, randomised init, reference.npz, re-seeding, the sanity
checks); what is new here:
  - each fixture lists the features it is meant to exercise, and each must move the logits by > 1e-2
    when switched off on the same weights (`must_change`): Granite's four multipliers, the top-k of the
    router, OLMo 3's windows and its YaRN on full layers only, YaRN's factor and attention factor,
    Ministral 3's query scale (the prompt runs past original_max_position_embeddings, so it is not 1);
  - the multimodal wrappers are built with a tiny vision tower and projector (AutoModelForImageTextToText)
    and their reference is the wrapper's logits on a text-only prompt. transformers 5.24 saves them in the
    layout the hub checkpoints have (`language_model.model.*`, `vision_tower.*`, ...); the `_v5` fixtures
    are rewritten into the layout transformers 5 keeps in memory (`model.language_model.*`, `lm_head`), and
    transformers is checked to load both into bit-identical logits.
`_v4` fixtures carry the 4.x config spelling (rope_theta / rope_scaling / torch_dtype), written by
`rewrite_v4_rope` below and checked to load bit-identically.
"""
from __future__ import annotations

import copy
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_fixtures as mf  # noqa: E402

OUT = mf.OUT

mf.TOKENIZER_STYLES.update({
    # Granite 3.x: <|end_of_text|>=0 is bos, eos and pad; nothing added to the input; ChatML-like turns.
    "granite": dict(specials=["<|end_of_text|>", "<|start_of_role|>", "<|end_of_role|>"], bos="<|end_of_text|>",
                    eos="<|end_of_text|>", unk=None, pad="<|end_of_text|>", add_bos=False),
    # Mistral 3 (Tekken-like ids): <unk>=0 <s>=1 </s>=2 [INST] [/INST] [IMG] [IMG_BREAK] [IMG_END], <s> prepended.
    "mistral3": dict(specials=["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[IMG]", "[IMG_BREAK]", "[IMG_END]"],
                     bos="<s>", eos="</s>", unk="<unk>", pad=None, add_bos=True),
    # Gemma 3 instruct plus its image tokens.
    "gemma3_mm": dict(mf.TOKENIZER_STYLES["gemma_chat"],
                      specials=["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>",
                                "<start_of_image>", "<end_of_image>", "<image_soft_token>"]),
})

GRANITE = dict(embedding_multiplier=12.0, attention_multiplier=0.015625, residual_multiplier=0.22, logits_scaling=8.0)
# tied embeddings read the small input embeddings back as logits: smaller multipliers keep top-2 gaps > 1e-3
GRANITE_TIED = dict(embedding_multiplier=4.0, attention_multiplier=0.03125, residual_multiplier=0.5, logits_scaling=2.0)
TINY = dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
            max_position_embeddings=512)


def text(cls: str, **kw):
    return lambda v, s: getattr(transformers, cls)(**{**TINY, "vocab_size": v, **kw, **s})


def tok_id(tok, s: str) -> int:
    return tok.token_to_id(s)


def mistral3(tok, v, s, **text_kw):
    tc = transformers.Ministral3Config(**{**TINY, "vocab_size": v, "num_hidden_layers": 2, **text_kw, **s})
    vc = transformers.PixtralVisionConfig(hidden_size=16, intermediate_size=16, num_hidden_layers=1,
                                          num_attention_heads=2, head_dim=8, image_size=16, patch_size=4)
    return transformers.Mistral3Config(vision_config=vc, text_config=tc, spatial_merge_size=2,
                                       image_token_index=tok_id(tok, "[IMG]"), tie_word_embeddings=False)


def gemma3(tok, v, s, **text_kw):
    tc = transformers.Gemma3TextConfig(**{**TINY, "vocab_size": v, "head_dim": 16, "num_hidden_layers": 4,
                                          "query_pre_attn_scalar": 24, "sliding_window": 16, **text_kw, **s})
    vc = transformers.SiglipVisionConfig(hidden_size=16, intermediate_size=16, num_hidden_layers=1,
                                         num_attention_heads=2, image_size=16, patch_size=4)
    return transformers.Gemma3Config(text_config=tc, vision_config=vc, mm_tokens_per_image=4,
                                     image_token_index=tok_id(tok, "<image_soft_token>"),
                                     boi_token_index=tok_id(tok, "<start_of_image>"),
                                     eoi_token_index=tok_id(tok, "<end_of_image>"), **s)


YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16}
MINISTRAL_ROPE = {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 16.0, "original_max_position_embeddings": 16,
                  "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                  "llama_4_scaling_beta": 0.1}

FIXTURES = {
    "granite": dict(
        family="granite", style="granite", vocab=300, seed=30, embed_std=0.02,
        checks=["multipliers"],
        config=text("GraniteConfig", num_hidden_layers=2, **GRANITE,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    "granite_v4": dict(
        family="granite", style="granite", vocab=296, seed=31, dtype=torch.bfloat16, v4=True, embed_std=0.1,
        stds={"mlp": 0.4, "o_proj": 0.4},  # tied: see make_fixtures' gemma2
        checks=["multipliers"],
        config=text("GraniteConfig", num_hidden_layers=2, num_key_value_heads=1, tie_word_embeddings=True,
                    attention_bias=False, mlp_bias=False, **GRANITE_TIED,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000000.0})),
    "granitemoe": dict(
        family="granitemoe", style="granite", vocab=304, seed=32, embed_std=0.02,
        checks=["multipliers", "top_k"],
        config=text("GraniteMoeConfig", num_hidden_layers=2, intermediate_size=16, num_local_experts=6,
                    num_experts_per_tok=2, **GRANITE, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    "granitemoe_v4": dict(
        family="granitemoe", style="granite", vocab=308, seed=33, dtype=torch.bfloat16, v4=True, embed_std=0.1,
        stds={"experts": 0.4, "input_linear": 0.4, "output_linear": 0.4, "o_proj": 0.4},
        checks=["multipliers", "top_k"],
        config=text("GraniteMoeConfig", num_hidden_layers=2, intermediate_size=16, num_local_experts=8,
                    num_experts_per_tok=3, tie_word_embeddings=True, **GRANITE_TIED,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    "olmo3": dict(
        # OLMo 3: windows of 8 on layers 0-2, layer 3 full with YaRN (rope_parameters nested per layer type)
        family="olmo3", style="olmo2", vocab=312, seed=34, checks=["window", "full_yarn"],
        config=text("Olmo3Config", num_hidden_layers=4, num_key_value_heads=4, sliding_window=8, rms_norm_eps=1e-6,
                    rope_parameters={"full_attention": dict(YARN, rope_theta=500000.0),
                                     "sliding_attention": {"rope_type": "default", "rope_theta": 500000.0}})),
    "olmo3_v4": dict(
        # as allenai/Olmo-3-1025-7B's config.json: rope_theta + rope_scaling (YaRN), layer_types, sliding_window
        family="olmo3", style="olmo2", vocab=316, seed=35, dtype=torch.bfloat16, v4=True, checks=["window", "full_yarn"],
        config=text("Olmo3Config", num_hidden_layers=4, sliding_window=8, rms_norm_eps=1e-6,
                    layer_types=["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
                    rope_parameters={"full_attention": dict(YARN, rope_theta=500000.0, factor=8.0,
                                                            attention_factor=1.2),
                                     "sliding_attention": {"rope_type": "default", "rope_theta": 500000.0}})),
    "ministral3": dict(
        family="ministral3", style="mistral3", vocab=320, seed=36, checks=["yarn", "query_scale"],
        config=text("Ministral3Config", num_hidden_layers=2, rope_parameters=dict(MINISTRAL_ROPE))),
    "qwen2_yarn_v4": dict(
        # Qwen2.5's documented long-context setting, in its 4.x spelling: rope_scaling {"type": "yarn", ...}
        family="qwen2", style="qwen2", vocab=324, seed=37, v4="type", checks=["yarn"],
        config=text("Qwen2Config", num_hidden_layers=2, use_sliding_window=False, max_position_embeddings=64,
                    rope_parameters=dict(YARN, rope_theta=1000000.0))),
    "llama_yarn": dict(
        # mscale / mscale_all_dim, non-default betas, no truncation, and a factor (8) that disagrees with
        # max_position_embeddings / original_max_position_embeddings (512 / 16 = 32): the explicit factor wins
        family="llama", style="llama", vocab=328, seed=38, checks=["yarn"],
        config=text("LlamaConfig", num_hidden_layers=2, head_dim=16, rope_parameters={
            "rope_type": "yarn", "rope_theta": 10000.0, "factor": 8.0, "original_max_position_embeddings": 16,
            "beta_fast": 16.0, "beta_slow": 2.0, "mscale": 0.8, "mscale_all_dim": 0.5, "truncate": False})),
    "mistral3": dict(
        # the layout transformers 5.24 saves (and the hub has): language_model.model.*, vision_tower.*
        family="ministral3", style="mistral3", vocab=332, seed=39, wrapper=mistral3, checks=["yarn", "query_scale"],
        v4=True, text_kw=dict(rope_parameters=dict(MINISTRAL_ROPE))),
    "mistral3_v5": dict(
        family="ministral3", style="mistral3", vocab=336, seed=40, wrapper=mistral3, layout="v5",
        checks=["yarn", "query_scale"], text_kw=dict(rope_parameters=dict(MINISTRAL_ROPE, factor=8.0))),
    "gemma3": dict(
        family="gemma3_text", style="gemma3_mm", vocab=340, seed=41, wrapper=gemma3, v4=True, embed_std=0.05,
        stds={"mlp": 0.35, "o_proj": 0.35},
        text_kw=dict(layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
                     rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
                                      "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})),
    "gemma3_v5": dict(
        family="gemma3_text", style="gemma3_mm", vocab=344, seed=42, wrapper=gemma3, layout="v5", embed_std=0.05,
        stds={"mlp": 0.35, "o_proj": 0.35},
        text_kw=dict(layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention"],
                     rope_parameters={"full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 200000.0},
                                      "sliding_attention": {"rope_type": "default", "rope_theta": 3000.0}})),
}


# --- building, saving, reloading ------------------------------------------------------------------------

def build(spec: dict, tok, seed: int):
    style = mf.TOKENIZER_STYLES[spec["style"]]
    vocab = tok.get_vocab_size()
    ids = mf.special_ids(tok, style)
    if spec.get("wrapper"):
        config = spec["wrapper"](tok, vocab, ids, **spec.get("text_kw", {}))
        torch.manual_seed(seed)
        model = AutoModelForImageTextToText.from_config(config, attn_implementation="eager", dtype=torch.float32)
        family = "gemma3_text" if spec["family"] == "gemma3_text" else spec["family"]
    else:
        config = spec["config"](vocab, ids)
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32)
        family = spec["family"]
    mf.randomise(model, family, embed_std=spec.get("embed_std"), stds=spec.get("stds"))
    model.eval()
    for k, v in ids.items():
        setattr(model.generation_config, k, v)
    return model


def load(path: Path, spec: dict):
    cls = AutoModelForImageTextToText if spec.get("wrapper") else AutoModelForCausalLM
    return cls.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()


def save(model, spec: dict, path: Path) -> None:
    dtype = spec.get("dtype", torch.float32)
    copy.deepcopy(model).to(dtype).save_pretrained(path)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(dtype).float())
    if spec.get("layout") == "v5":
        relayout_v5(path / "model.safetensors")
    if spec.get("v4"):
        rewrite_v4_rope(path / "config.json", type_only=spec["v4"] == "type")


def relayout_v5(file: Path) -> None:
    """The wrapper's tensors renamed into the layout transformers 5 keeps in memory (and llava's conversion
    maps the hub layout to): language_model.model.* -> model.language_model.*, vision_tower.* ->
    model.vision_tower.*, multi_modal_projector.* -> model.multi_modal_projector.*."""
    tensors = load_file(str(file))
    renamed = {}
    for k, v in tensors.items():
        for old, new in (("language_model.model.", "model.language_model."), ("language_model.lm_head.", "lm_head."),
                         ("vision_tower.", "model.vision_tower."),
                         ("multi_modal_projector.", "model.multi_modal_projector.")):
            if k.startswith(old):
                k = new + k[len(old):]
                break
        renamed[k] = v
    assert any(k.startswith("model.language_model.") for k in renamed), sorted(renamed)[:5]
    save_file(renamed, str(file), metadata={"format": "pt"})


def rewrite_v4_rope(file: Path, type_only: bool = False) -> None:
    """config.json (or its text_config) as 4.x hub checkpoints spell it: rope_theta + rope_scaling (the
    full-attention entry for per-layer-type RoPE, with rope_local_base_freq for Gemma 3's sliding layers),
    torch_dtype for dtype. `type_only`: the scaling's kind as "type" alone, as Qwen2.5's model card writes it."""
    cfg = json.loads(file.read_text())
    cfg["torch_dtype"] = cfg.pop("dtype")
    cfg["transformers_version"] = "4.57.1"
    target = cfg.get("text_config", cfg)
    rope = target.pop("rope_parameters")
    if "full_attention" in rope:
        full, local = rope["full_attention"], rope["sliding_attention"]
        assert local["rope_type"] == "default" and local["rope_theta"] == full["rope_theta"] or \
            target.get("model_type") == "gemma3_text", local
        if target.get("model_type") == "gemma3_text":
            target["rope_local_base_freq"] = local["rope_theta"]
        rope = full
    target["rope_theta"] = rope.pop("rope_theta")
    rope.pop("type", None)
    if rope.get("rope_type") == "default":
        target["rope_scaling"] = None
    else:
        rope["type"] = rope.pop("rope_type") if type_only else rope["rope_type"]
        target["rope_scaling"] = rope
    file.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


# --- checks: each feature changes the logits ----------------------------------------------------------------

def text_config(model):
    return model.config.get_text_config()


@torch.no_grad()
def changed(loaded, spec, x, edit) -> float:
    """Max |logit difference| against the same weights under a config that `edit(text_config)` changed."""
    config = copy.deepcopy(loaded.config)
    edit(config.get_text_config())
    cls = AutoModelForImageTextToText if spec.get("wrapper") else AutoModelForCausalLM
    other = cls.from_config(config, attn_implementation="eager", dtype=torch.float32).eval()
    other.load_state_dict(loaded.state_dict())
    return (other(x).logits - loaded(x).logits).abs().max().item()


def setter(**fields):
    return lambda c: [setattr(c, k, v) for k, v in fields.items()]


def rope_edit(layer_type, **changes):
    def edit(c):
        rp = c.rope_parameters[layer_type] if layer_type else c.rope_parameters
        for k, v in changes.items():
            if v is None:
                rp.pop(k, None)
            else:
                rp[k] = v
    return edit


def run_checks(name, spec, loaded, x) -> None:
    c = text_config(loaded)
    for check in spec.get("checks", []):
        if check == "multipliers":
            for field in GRANITE:
                mf.must_change(name, field, changed(loaded, spec, x, setter(**{field: 1.0})))
        elif check == "top_k":
            mf.must_change(name, "num_experts_per_tok", changed(loaded, spec, x, setter(
                num_experts_per_tok=c.num_experts_per_tok + 1)))
        elif check == "window":
            mf.check_windows(name, c, loaded_attentions(loaded, x))
        elif check == "full_yarn":
            mf.must_change(name, "YaRN on the full layer", changed(loaded, spec, x, rope_edit(
                "full_attention", rope_type="default", factor=None, original_max_position_embeddings=None,
                attention_factor=None)))
        elif check == "yarn":
            nested = "full_attention" in c.rope_parameters
            where = "full_attention" if nested else None
            rp = c.rope_parameters[where] if nested else c.rope_parameters
            assert x.shape[1] > rp["original_max_position_embeddings"], "the prompt does not pass original_max"
            mf.must_change(name, "YaRN's factor", changed(loaded, spec, x, rope_edit(where, factor=rp["factor"] * 2)))
            mf.must_change(name, "YaRN (vs default RoPE)", changed(loaded, spec, x, rope_edit(
                where, rope_type="default")))
        elif check == "query_scale":
            mf.must_change(name, "llama_4_scaling_beta", changed(loaded, spec, x, rope_edit(
                None, llama_4_scaling_beta=0.0)))


@torch.no_grad()
def loaded_attentions(model, x) -> np.ndarray:
    return torch.stack([a[0] for a in model(x, output_attentions=True).attentions]).float().numpy()


# --- one fixture ------------------------------------------------------------------------------------------

def make(name: str) -> dict:
    spec = FIXTURES[name]
    style = mf.TOKENIZER_STYLES[spec["style"]]
    path = OUT / name
    tok = mf.train_tokenizer(style, spec["vocab"])
    prompt = mf.choose_prompt(tok)
    ids = tok.encode(prompt).ids
    for seed in range(spec["seed"], spec["seed"] + 1000, 100):
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        model = build(spec, tok, seed)
        save(model, spec, path)
        mf.save_tokenizer(tok, style, path)
        loaded = load(path, spec)
        ref = mf.reference(loaded, ids)
        distinct = len(set(ref["greedy_ids"].tolist()))
        if ref["min_gap"] > mf.MIN_GAP and distinct >= mf.MIN_DISTINCT:
            break
        print(f"{name}: seed {seed}: top-2 gap {ref['min_gap']:.2e}, {distinct} distinct greedy ids; re-seeding")
    else:
        raise SystemExit(f"{name}: no seed gives a greedy top-2 gap > {mf.MIN_GAP}")
    x = torch.tensor([ids])
    with torch.no_grad():
        diff = (model(x).logits - loaded(x).logits).abs().max().item()
    assert diff == 0.0, f"{name}: the saved checkpoint loads into logits {diff} away from the built model"
    gen = mf.generate_ids(loaded, ids)
    assert (gen == ref["greedy_ids"]).all(), f"{name}: generate {gen} != loop {ref['greedy_ids']}"
    assert np.allclose(ref["attentions"].sum(-1), 1.0, atol=1e-5)
    run_checks(name, spec, loaded, x)
    chat = mf.check_tokenizer(path, tok, prompt, style)
    arrays = {k: v for k, v in ref.items() if k != "min_gap"}
    arrays.update(prompt=np.array(prompt), transformers_version=np.array(transformers.__version__),
                  torch_version=np.array(torch.__version__))
    if chat is not None:
        arrays["chat_text"] = np.array(chat)
    np.savez_compressed(path / "reference.npz", **arrays)
    size = sum(p.stat().st_size for p in path.iterdir())
    return dict(name=name, family=spec["family"], seed=seed, T=len(ids), min_gap=round(ref["min_gap"], 4),
                kb=size // 1024)


# --- routed experts: transformers' routing and expert ablation -----------------------------------------------

EXPERT_FIXTURES = ("granitemoe", "granitemoe_v4")


@torch.no_grad()
def expert_reference(name: str) -> None:
    """tests/fixtures/<name>/expert_reference.npz: each layer's routing as GraniteMoeTopKRouter returns it
    (top_k_index, top_k_weights: a forward hook), and the logits with some experts' down projections zeroed
    in the state dict (the expert adds nothing where it was chosen; nothing else changes). Also called by
    scripts/make_hybrid_fixtures.py for Granite 4.0-H with experts (GraniteMoeHybridTopKRouter, the same)."""
    path = OUT / name
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    ids = np.load(path / "reference.npz")["input_ids"].astype(np.int64)
    x = torch.tensor(ids)[None]
    layers = model.model.layers
    seen = {}
    hooks = [layer.block_sparse_moe.router.register_forward_hook(
        lambda mod, args, out, l=l: seen.__setitem__(l, out)) for l, layer in enumerate(layers)]
    clean = model(x).logits[0]
    for h in hooks:
        h.remove()
    experts = np.stack([seen[l][2].numpy() for l in range(len(layers))])              # (L, T, k)
    weights = np.stack([seen[l][1].float().numpy() for l in range(len(layers))])      # (L, T, k)
    E, L = model.config.num_local_experts, len(layers)
    first = int(experts[0, -1, 0])  # the last token's best expert in layer 0: an ablation that must matter
    sets = [[[0, first]], [[L - 1, 0], [0, E - 1]], [[L - 1, e] for e in range(E)]]
    ablated = []
    for s in sets:
        saved = {l: layers[l].block_sparse_moe.experts.down_proj.detach().clone() for l, _ in s}
        for l, e in s:
            layers[l].block_sparse_moe.experts.down_proj.data[e] = 0
        ablated.append(model(x).logits[0].numpy())
        for l, w in saved.items():
            layers[l].block_sparse_moe.experts.down_proj.data.copy_(w)
    for a in ablated:
        assert np.abs(a - clean.numpy()).max() > 1e-3, "an expert ablation that changes nothing tests nothing"
    np.savez_compressed(path / "expert_reference.npz", input_ids=ids, experts=experts.astype(np.int64),
                        weights=weights.astype(np.float32), ablations=np.array(json.dumps(sets)),
                        ablated=np.stack(ablated).astype(np.float32),
                        transformers_version=np.array(transformers.__version__))
    print(f"{name}: routing of {experts.shape[1]} tokens in {L} layers, {len(sets)} expert ablations")


# --- YaRN at real sizes: transformers' inv_freq and attention factor ----------------------------------------

YARN_CASES = {  # name: (config class, fields): the hub's settings, and edge cases of transformers' reading
    "ministral-3-3b": ("Ministral3Config", dict(head_dim=128, max_position_embeddings=262144, rope_parameters=dict(
        rope_type="yarn", rope_theta=1e6, factor=16.0, original_max_position_embeddings=16384, beta_fast=32.0,
        beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0, llama_4_scaling_beta=0.1))),
    "qwen2.5-yarn": ("Qwen2Config", dict(hidden_size=1536, num_attention_heads=12, num_key_value_heads=2,
                                         max_position_embeddings=32768,
                                         rope_scaling={"type": "yarn", "factor": 4.0,
                                                       "original_max_position_embeddings": 32768},
                                         rope_theta=1e6)),
    "olmo-3-full-layers": ("LlamaConfig", dict(hidden_size=4096, num_attention_heads=32, max_position_embeddings=65536,
                                               rope_parameters=dict(rope_type="yarn", rope_theta=5e5, factor=8.0,
                                                                    original_max_position_embeddings=8192,
                                                                    attention_factor=1.2079441541679836))),
    "factor-disagrees": ("LlamaConfig", dict(hidden_size=512, num_attention_heads=4, max_position_embeddings=4096,
                                             rope_parameters=dict(rope_type="yarn", rope_theta=1e4, factor=2.0,
                                                                  original_max_position_embeddings=1024))),
    "mscale-and-all-dim": ("LlamaConfig", dict(hidden_size=1024, num_attention_heads=8, max_position_embeddings=163840,
                                               rope_parameters=dict(rope_type="yarn", rope_theta=1e4, factor=40.0,
                                                                    original_max_position_embeddings=4096,
                                                                    mscale=0.707, mscale_all_dim=0.707,
                                                                    beta_fast=32, beta_slow=1))),
    "no-truncate-partial": ("Qwen2Config", dict(hidden_size=768, num_attention_heads=6, num_key_value_heads=6,
                                                max_position_embeddings=8192,
                                                rope_parameters=dict(rope_type="yarn", rope_theta=5e5, factor=4.0,
                                                                     original_max_position_embeddings=2048,
                                                                     beta_fast=8.0, beta_slow=0.5, truncate=False,
                                                                     partial_rotary_factor=0.5))),
}


def yarn_reference() -> None:
    """tests/fixtures/yarn_frequencies.json: for each case, its config.json as transformers 5.24 saves it,
    and ROPE_INIT_FUNCTIONS['yarn']'s inv_freq (float32, as a list) and attention factor."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    out = {}
    for name, (cls, fields) in YARN_CASES.items():
        config = getattr(transformers, cls)(vocab_size=32, num_hidden_layers=1, **fields)
        inv_freq, attention = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
        out[name] = {"config": json.loads(config.to_json_string()), "inv_freq": inv_freq.tolist(),
                     "attention_factor": attention}
    (OUT / "yarn_frequencies.json").write_text(json.dumps(out, indent=1) + "\n")
    print(f"yarn_frequencies.json: {len(out)} cases")


def main(names: list[str]) -> None:
    if not names or "yarn" in names:
        yarn_reference()
    for name in [n for n in names if n != "yarn"] if names else list(FIXTURES):
        if name in FIXTURES:
            print(json.dumps(make(name)))
        if name in EXPERT_FIXTURES:
            expert_reference(name)


if __name__ == "__main__":
    main(sys.argv[1:])
