"""config.json and generation_config.json: every field given every bad value, and the values that must be refused."""
from __future__ import annotations

import json
import random

from .core import FIXTURES, Case, case_label, json_bytes, special_file, symlink_file, write_file

# --- config.json, generation_config.json ------------------------------------------------------------

BAD_VALUES = ["x", "", [1], [], {"a": 1}, {}, None, True, False, 1.5, -1, 0, 10**12, 2**64, float("nan"),
              float("-inf"), "1" * 10_000]
CONFIG_EXTRA_KEYS = ["layer_types", "sliding_window", "use_sliding_window", "rope_scaling", "rope_theta",
                     "rope_parameters", "head_dim", "partial_rotary_factor", "attention_bias", "mlp_bias",
                     "num_key_value_heads", "eos_token_id", "bos_token_id", "architectures", "max_window_layers",
                     "tie_word_embeddings", "hidden_act", "torch_dtype", "dtype", "intermediate_size"]



def config_cases(rng: random.Random, full: bool) -> list[Case]:
    cases = []
    fixtures = ["llama_gqa3", "gpt2", "mistral_sliding", "qwen2", "gemma", "llama3_rope"] if full else ["llama_gqa3", "gpt2"]
    for fx in fixtures:
        cfg = json.loads((FIXTURES / fx / "config.json").read_text())
        keys = sorted(set(cfg) | set(CONFIG_EXTRA_KEYS))
        for key in keys:
            values = BAD_VALUES if full else rng.sample(BAD_VALUES, 2)
            for v in values:
                new = {**cfg, key: v}
                cases.append(Case("config", f"{fx}/{key}={case_label(v)}", write_file(fx, "config.json", json_bytes(new)),
                                  "either"))
    cfg = json.loads((FIXTURES / "llama_gqa3" / "config.json").read_text())
    n = cfg["num_hidden_layers"]
    specific = [
        ("model_type-list", {"model_type": ["llama"]}, "error"), ("model_type-int", {"model_type": 5}, "error"),
        ("rope_scaling-string", {"rope_scaling": "linear"}, "error"),
        ("rope_parameters-string", {"rope_parameters": "x"}, "error"),
        ("layer_types-int", {"layer_types": 3, "model_type": "mistral"}, "error"),
        ("layer_types-strings", {"layer_types": ["x"] * n, "model_type": "mistral"}, "error"),
        ("layer_types-dicts", {"layer_types": [{}] * n, "model_type": "mistral"}, "error"),
        ("layer_types-short", {"layer_types": ["full_attention"], "model_type": "mistral"}, "error"),
        ("layer_types-ignored-by-llama", {"layer_types": 3}, "either"),
        ("eos-x", {"eos_token_id": "x"}, "error"), ("eos-list-x", {"eos_token_id": ["x"]}, "error"),
        ("sliding_window-0", {"sliding_window": 0, "model_type": "mistral"}, "error"),
        ("num_hidden_layers-10**12", {"num_hidden_layers": 10**12}, "error"),
        ("num_hidden_layers-plus-1", {"num_hidden_layers": n + 1}, "error"),
        ("num_hidden_layers-minus-1", {"num_hidden_layers": n - 1}, "error"),
        ("vocab_size-10**12", {"vocab_size": 10**12}, "error"), ("hidden_size-10**12", {"hidden_size": 10**12}, "error"),
        ("intermediate_size-10**12", {"intermediate_size": 10**12}, "error"),
        ("num_attention_heads-10**12", {"num_attention_heads": 10**12}, "error"),
        ("head_dim-10**12", {"head_dim": 10**12}, "error"),
        ("rms_norm_eps-nan", {"rms_norm_eps": float("nan")}, "error"),
        ("rms_norm_eps-negative", {"rms_norm_eps": -1e-5}, "error"),
        ("rms_norm_eps-zero", {"rms_norm_eps": 0}, "error"),
        ("rope_theta-nan", {"rope_parameters": {"rope_theta": float("nan"), "rope_type": "default"}}, "error"),
        ("rope_theta-inf", {"rope_parameters": {"rope_theta": float("inf"), "rope_type": "default"}}, "error"),
        ("rope_factor-0", {"rope_parameters": {"rope_theta": 1e4, "rope_type": "linear", "factor": 0}}, "error"),
        ("rope_factor-nan", {"rope_parameters": {"rope_theta": 1e4, "rope_type": "linear", "factor": float("nan")}}, "error"),
        ("rope-llama3-equal-freq-factors", {"rope_parameters": {"rope_theta": 1e4, "rope_type": "llama3", "factor": 8.0,
                                                               "low_freq_factor": 1.0, "high_freq_factor": 1.0,
                                                               "original_max_position_embeddings": 64}}, "either"),
        ("rope-llama3-original-max-x", {"rope_parameters": {"rope_theta": 1e4, "rope_type": "llama3", "factor": 8.0,
                                                           "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                           "original_max_position_embeddings": "x"}}, "error"),
        ("architectures-int", {"architectures": 5}, "either"), ("architectures-list-int", {"architectures": [5]}, "either"),
        ("torch_dtype-list", {"torch_dtype": ["x"]}, "either"),
        ("max_position_embeddings-10**12", {"max_position_embeddings": 10**12}, "either"),
        ("head_dim-10**400", {"head_dim": 10**400}, "error"), ("hidden_size-2**1024", {"hidden_size": 2**1024}, "error"),
        ("rope_theta-10**400", {"rope_parameters": {"rope_theta": 10**400, "rope_type": "default"}}, "error"),
        ("rms_norm_eps-10**400", {"rms_norm_eps": 10**400}, "error"),
    ]
    for label, change, expect in specific:
        for which in ("generate", "info"):
            new = {**cfg, **change}
            cases.append(Case("config", f"llama_gqa3/{label}/{which}",
                              write_file("llama_gqa3", "config.json", json_bytes(new), which), expect, key=which == "generate"))
    for label, content in [("not-json", b"{nope"), ("list", b"[]"), ("empty", b""), ("invalid-utf8", b'{"a": "\xff"}'),
                           ("bom", b"\xef\xbb\xbf{}"), ("deep-nesting", b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
                           ("5000-digits", b'{"vocab_size": ' + b"7" * 5000 + b"}"), ("nul", b"\0" * 100)]:
        cases.append(Case("config", f"llama_gqa3/file-{label}", write_file("llama_gqa3", "config.json", content),
                          key=label in ("deep-nesting", "5000-digits", "invalid-utf8")))
    for target in ["/dev/zero", "/proc/self/mem", "/etc/passwd"]:
        cases.append(Case("config", f"llama_gqa3/symlink-{target}", symlink_file("llama_gqa3", "config.json", target), key=True))
    cases.append(Case("config", "llama_gqa3/config-fifo", special_file("llama_gqa3", "config.json", "fifo"), key=True))
    cases.append(Case("config", "llama_gqa3/config-dir", special_file("llama_gqa3", "config.json", "dir")))
    return cases


GEN_KEYS = ["temperature", "top_k", "top_p", "min_p", "repetition_penalty", "do_sample", "eos_token_id",
            "bos_token_id", "pad_token_id", "max_new_tokens"]


def generation_config_cases(rng: random.Random, full: bool) -> list[Case]:
    cases = []
    base = {"do_sample": True, "temperature": 0.7, "top_k": 20, "top_p": 0.9, "eos_token_id": 4, "bos_token_id": 1}
    for key in GEN_KEYS:
        for v in (BAD_VALUES if full else rng.sample(BAD_VALUES, 3)):
            new = {**base, key: v}
            cases.append(Case("generation_config", f"llama_gqa3/{key}={case_label(v)}",
                              write_file("llama_gqa3", "generation_config.json", json_bytes(new)), "either"))
    for label, change, expect in [("temperature-hot", {"temperature": "hot"}, "error"),
                                  ("top_p-nan", {"top_p": float("nan")}, "error"),
                                  ("top_k-1.5", {"top_k": 1.5}, "error"), ("eos-x", {"eos_token_id": "x"}, "error"),
                                  ("eos-list-x", {"eos_token_id": [4, "x"]}, "error"),
                                  ("repetition_penalty-0", {"repetition_penalty": 0}, "error"),
                                  ("do_sample-yes", {"do_sample": "yes"}, "error"),
                                  ("temperature-10**400", {"temperature": 10**400}, "error"),
                                  ("greedy-nulls", {"do_sample": False, "temperature": None, "top_p": None}, "ok")]:
        new = {**base, **change}
        cases.append(Case("generation_config", f"llama_gqa3/{label}",
                          write_file("llama_gqa3", "generation_config.json", json_bytes(new)), expect, key=True))
    for label, content in [("not-json", b"{"), ("list", b"[1]"), ("deep", b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}")]:
        cases.append(Case("generation_config", f"llama_gqa3/file-{label}",
                          write_file("llama_gqa3", "generation_config.json", content), key=label == "deep"))
    cases.append(Case("generation_config", "llama_gqa3/symlink-/dev/zero",
                      symlink_file("llama_gqa3", "generation_config.json", "/dev/zero"), key=True))
    return cases



