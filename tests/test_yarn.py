"""YaRN at real sizes against transformers: tests/fixtures/yarn_frequencies.json holds, per case, the
config.json transformers 5.24 wrote and what its ROPE_INIT_FUNCTIONS['yarn'] computed from it
(scripts/make_family_fixtures.py yarn): Ministral 3 3B's and Qwen2.5's hub settings, OLMo 3's full layers,
a factor that disagrees with max / original (the explicit factor is used), mscale with mscale_all_dim,
no truncation with partial rotary. The parity fixtures check YaRN end to end past the original context."""
import json

import numpy as np
import pytest

from minigen.checkpoint.config import parse_config
from minigen.engine.layers import query_scale, rope_frequencies
from minigen.engine.config import Rope

from conftest import FIXTURES_DIR

CASES = json.loads((FIXTURES_DIR / "yarn_frequencies.json").read_text())


@pytest.mark.parametrize("name", sorted(CASES))
def test_inv_freq_and_attention_factor_are_transformers(name):
    case = CASES[name]
    rope = parse_config(case["config"]).rope[0]
    assert rope.kind == "yarn"
    want = np.array(case["inv_freq"], np.float32)
    got = rope_frequencies(rope)
    assert got.dtype == np.float32 and got.shape == want.shape
    # minigen rounds a float64 pow once, the same on every CPU; torch's float32 pow is an ulp or two off that
    # (1 seen) and its SIMD path differs by CPU: a few ulps of float32 (~1.2e-7 each), not the last bit
    np.testing.assert_allclose(got, want, rtol=5e-7, atol=0)
    assert rope.attention_factor == pytest.approx(case["attention_factor"], rel=1e-12)


def test_the_explicit_factor_wins_over_max_over_original():
    rope = parse_config(CASES["factor-disagrees"]["config"]).rope[0]
    assert (rope.factor, rope.original_max) == (2.0, 1024)   # 4096 / 1024 would be 4


def test_ministral_query_scale_steps_at_each_multiple_of_the_original_context():
    rope = parse_config(CASES["ministral-3-3b"]["config"]).rope[0]
    assert (rope.query_beta, rope.original_max) == (0.1, 16384)
    s = query_scale(rope, np.array([0, 16383, 16384, 32767, 32768, 100000]))
    np.testing.assert_allclose(s, 1 + 0.1 * np.log1p([0, 0, 1, 1, 2, 6]), rtol=1e-6)
    assert query_scale(Rope(1e4, 8), np.arange(3)) is None
