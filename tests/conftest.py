"""Shared test helpers: the parity fixtures made by scripts/make_fixtures.py (see tests/fixtures/README.md)."""
from pathlib import Path

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
}


def load_reference(name: str) -> dict:
    """tests/fixtures/<name>/reference.npz as a dict of arrays (0-d str arrays for prompt and versions)."""
    with np.load(FIXTURES_DIR / name / "reference.npz") as z:
        return {k: z[k] for k in z.files}


@pytest.fixture
def reference():
    """The `load_reference` helper as a pytest fixture: `def test_x(reference): ref = reference("gpt2")`."""
    return load_reference


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: a test that takes more than a few seconds")
