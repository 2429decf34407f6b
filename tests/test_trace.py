"""`minigen trace`: the seeds' walk-through, on the seeds' own numbers and on every fixture family."""
import numpy as np
import pytest
from click.testing import CliRunner

import minigen
from minigen.cli import main
from minigen.inspect.internals import trace_head
from minigen.inspect.trace import attention_steps, format_steps, format_tables

from conftest import FIXTURES, FIXTURES_DIR, load_reference

# ../shared/seeds/: birds, eat, seeds with d_model = 4, d_k = 2
X = np.array([[1, 0, 2, 0], [0, 2, 0, 1], [1, 1, 0, 1]])
W_Q = np.array([[1, 2], [1, 0], [0, 1], [0, 1]])
W_K = np.array([[1, 0], [0, 1], [1, 0], [1, 0]])
W_V = np.array([[0, 2], [2, 0], [0, 1], [0, 2]])
LABELS = ["birds", "eat", "seeds"]


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_seeds_numbers():
    s = attention_steps(X, W_Q, W_K, W_V)
    np.testing.assert_array_equal(s.q, [[1, 4], [2, 1], [2, 3]])
    np.testing.assert_array_equal(s.k, [[3, 0], [1, 2], [2, 1]])
    np.testing.assert_array_equal(s.v, [[0, 4], [4, 2], [2, 4]])
    np.testing.assert_array_equal(s.scores, [[3, 9, 6], [6, 4, 5], [6, 8, 7]])
    np.testing.assert_allclose(s.scaled, [[2.12, 6.36, 4.24], [4.24, 2.83, 3.54], [4.24, 5.66, 4.95]], atol=5e-3)
    np.testing.assert_allclose(s.weights[0], [0.013, 0.882, 0.106], atol=5e-4)
    np.testing.assert_allclose(s.out, [[3.74, 2.24], [1.13, 3.72], [2.87, 2.85]], atol=5e-3)
    # without the scaling the top row collapses, as the article shows: 0.002, 0.950, 0.047
    np.testing.assert_allclose(attention_steps(X, W_Q, W_K, W_V, scale=1.0).weights[0], [0.002, 0.950, 0.047], atol=5e-4)


def test_seeds_printed():
    text = "\n".join(format_tables(attention_steps(X, W_Q, W_K, W_V), LABELS))
    for row in ["birds         3       9       6", "eat           6       4       5", "seeds         6       8       7",
                "birds      2.12    6.36    4.24", "birds     0.013   0.882   0.106",
                "birds  (3.74, 2.24)", "eat    (1.13, 3.72)", "seeds  (2.87, 2.85)"]:
        assert row in text, row
    walk = "\n".join(format_steps(attention_steps(X, W_Q, W_K, W_V), LABELS, 0))
    for piece in ["q = x W_Q = (1, 4)", "k = (1, 2)   v = (4, 2)", "'eat' [1]      9", "6.36", "88.16%",
                  "0.013 x v[0] + 0.882 x v[1] + 0.106 x v[2]", "= (3.74, 2.24)"]:
        assert piece in walk, piece
    r = cli("trace", "--seeds")
    assert r.exit_code == 0 and "seeds         6       8       7" in r.output and "(2.87, 2.85)" in r.output


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_trace_equals_the_models_head_output(name):
    model = minigen.load(FIXTURES_DIR / name)[0]
    ids = load_reference(name)["input_ids"]
    c = model.config
    for layer, head in [(0, 0), (c.n_layers - 1, c.n_heads - 1)]:
        steps, own = trace_head(model, ids, layer, head)
        np.testing.assert_allclose(steps.out, own["out"], atol=1e-5)
        np.testing.assert_allclose(steps.weights, own["weights"], atol=1e-5)
        assert own["block_err"] < 1e-5                   # those heads are the model's attention block
        np.testing.assert_allclose(steps.weights, load_reference(name)["attentions"][layer, head], atol=1e-5)


@pytest.mark.parametrize("name", ["qwen2", "gpt2", "mistral_sliding"])
def test_trace_cli(name):
    r = cli("trace", "The cat sat on the mat, and the cat", "--model", FIXTURES_DIR / name,
            "--layer", 1, "--head", 1, "--token", -1)
    assert r.exit_code == 0, r.output
    assert "equal within" in r.output and "6. softmax" in r.output and "%" in r.output
    assert ("q bias b_Q" in r.output) == (name in ("qwen2", "gpt2"))
    assert ("after RoPE" in r.output) == (name != "gpt2")


@pytest.mark.parametrize("args,words", [
    (["--layer", 2, "--head", 0], ["--layer 2", "out of range"]),
    (["--layer", 0, "--head", 4], ["--head 4", "out of range"]),
    (["--layer", 0, "--head", 0, "--token", 99], ["--token 99", "past the prompt"]),
    (["--layer", 0, "--head", 0, "--token", "zebra"], ["--token 'zebra'"]),
])
def test_trace_bad_input(args, words):
    r = cli("trace", "The cat sat", "--model", FIXTURES_DIR / "gpt2", *args)
    assert r.exit_code != 0 and "Traceback" not in r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)
    for w in words:
        assert w in r.output, r.output
