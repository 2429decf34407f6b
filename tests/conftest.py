"""Shared test helpers: the parity fixtures made by scripts/make_fixtures.py (see tests/fixtures/README.md)."""
import os
import tempfile
from pathlib import Path

# numba's compiled kernels (minigen/engine/quant/kernels.py) are cached outside the tree, in one place
# per machine so that a second run of the suite does not compile them again (~20 s); set before numba loads
os.environ.setdefault("NUMBA_CACHE_DIR", os.path.join(tempfile.gettempdir(), f"minigen-tests-numba-{getattr(os, 'getuid', lambda: 0)()}"))

import numpy as np
import pytest

FIXTURES_DIR = Path(__file__).parent / "fixtures"

# fixture name -> family (config.json's model_type)
FIXTURES = {
    "gpt2": "gpt2",
    "llama_gqa3": "llama",
    "llama_bf16": "llama",
    "llama_sharded": "llama",
    "llama3_rope": "llama",
    "llama_linear_rope": "llama",
    "mistral_sliding": "mistral",
    "qwen2": "qwen2",
    "gemma": "gemma",
    "gemma2": "gemma2",
    "gemma2_v4": "gemma2",
    "gemma3_text": "gemma3_text",
    "gemma3_text_v4": "gemma3_text",
    "qwen3": "qwen3",
    "qwen3_v4": "qwen3",
    "phi3": "phi3",
    "phi3_longrope": "phi3",
    "phi3_longrope_v4": "phi3",
    "olmo2": "olmo2",
    "olmo2_v4": "olmo2",
    "gpt_neox": "gpt_neox",
    "gpt_neox_v4": "gpt_neox",
    "smollm3": "smollm3",
    "smollm3_v4": "smollm3",
    "granite": "granite",
    "granite_v4": "granite",
    "granitemoe": "granitemoe",
    "granitemoe_v4": "granitemoe",
    "olmo3": "olmo3",
    "olmo3_v4": "olmo3",
    "ministral3": "ministral3",
    "mistral3": "ministral3",       # the multimodal wrapper, hub layout (language_model.model.*), 4.x spelling
    "mistral3_v5": "ministral3",    # the wrapper in transformers 5's layout (model.language_model.*)
    "gemma3": "gemma3_text",        # Gemma3ForConditionalGeneration, hub layout, 4.x spelling
    "gemma3_v5": "gemma3_text",
    "llama_yarn": "llama",
    "qwen2_yarn_v4": "qwen2",
}
# the families whose layers are not all attention (scripts/make_hybrid_fixtures.py)
HYBRID_FIXTURES = {
    "qwen3_5_text": "qwen3_5_text",
    "qwen3_5_text_v4": "qwen3_5_text",
    "qwen3_5": "qwen3_5_text",   # as published: the wrapper around its text model
    "lfm2": "lfm2",
    "lfm2_v4": "lfm2",
    "granitemoehybrid": "granitemoehybrid",
    "granitemoehybrid_attn": "granitemoehybrid",
    "granitemoehybrid_moe": "granitemoehybrid",      # routed experts beside the shared MLP (Granite 4.0-H Tiny/Small)
    "granitemoehybrid_moe_v4": "granitemoehybrid",
    "falcon_h1": "falcon_h1",
    "falcon_h1_v4": "falcon_h1",
}


def load_reference(name: str) -> dict:
    """tests/fixtures/<name>/reference.npz as a dict of arrays (0-d str arrays for prompt and versions)."""
    with np.load(FIXTURES_DIR / name / "reference.npz") as z:
        return {k: z[k] for k in z.files}


@pytest.fixture
def rendered_today(monkeypatch):
    """The clock chat templates read (strftime_now) pinned to the day transformers rendered the committed
    references on (tests/fixtures/chat_templates/references.json's "today"): Granite and Llama 3.2 print it."""
    import datetime
    import json
    from minigen.text import template
    today = json.loads((FIXTURES_DIR / "chat_templates" / "references.json").read_text(encoding="utf-8"))["today"]
    monkeypatch.setattr(template, "now", lambda: datetime.datetime.fromisoformat(today))


@pytest.fixture
def reference():
    """The `load_reference` helper as a pytest fixture: `def test_x(reference): ref = reference("gpt2")`."""
    return load_reference


def greedy(model, prompt, n: int, eos: int | None = None) -> tuple[list[int], np.ndarray]:
    """Cached greedy decoding straight on the model (prefill, then one token at a time), stopping
    after `eos` if given: (generated ids, the logits after the prompt)."""
    cache = model.make_cache()
    logits = model.forward(np.asarray(prompt), cache, last_only=True)[-1]
    first, ids = logits, []
    for _ in range(n):
        ids.append(int(np.argmax(logits)))
        if ids[-1] == eos:
            break
        logits = model.forward(np.array(ids[-1:]), cache, last_only=True)[-1]
    return ids, first


def interrupt_generation(monkeypatch, after: int):
    """Make the generation loop raise KeyboardInterrupt (a Ctrl-C) once `after` tokens have been yielded."""
    from minigen.generation import steps as module
    real = module.decode

    def interrupted(*args, **kwargs):
        for i, step in enumerate(real(*args, **kwargs)):
            if i == after:
                raise KeyboardInterrupt
            yield step

    monkeypatch.setattr(module, "decode", interrupted)


@pytest.hookimpl(trylast=True)   # after -k and -m have deselected what they do
def pytest_collection_modifyitems(session, config, items):
    """Starts the AVX2 kernels' check (test_quant_kernels.start_avx2_check: a subprocess that compiles for a
    minute where the tests' numba cache does not hold its kernels yet) as soon as the suite is known to run it,
    so that it runs beside the other tests."""
    if any(item.name == "test_kernels_as_an_avx2_cpu_runs_them_equal_the_numpy_twin" for item in items):
        from test_quant_kernels import start_avx2_check
        config.minigen_avx2_check = start_avx2_check()


def pytest_unconfigure(config):
    run = getattr(config, "minigen_avx2_check", None)
    if run is not None:
        if run.poll() is None:
            run.kill()
        run.communicate()


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: a test that takes more than a few seconds")
