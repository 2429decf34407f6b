"""Write tests/fixtures/mixers/*.npz: transformers' torch reference kernels of the non-attention token
mixers run on small random arrays (needs torch + transformers; the tests do not).

    /root/ref/bin/python scripts/make_mixer_fixtures.py

Each file holds the inputs and what transformers 5.24 computes from them:

    conv.npz         causal_conv1d_fn over a whole sequence, then causal_conv1d_update one token at a time
    gated_delta.npz  torch_chunk_gated_delta_rule (one shot, initial state given) and
                     torch_recurrent_gated_delta_rule (the same tokens one at a time): outputs, final states
    mamba2.npz       mamba2_chunk_scan (with D, dt_bias, softplus, initial state) and
                     mamba2_selective_state_update token by token
    layers.npz       whole mixers as modules, no cache: Qwen3_5GatedDeltaNet, Lfm2ShortConv,
                     GraniteMoeHybridMambaLayer (gate before the group norm), FalconH1Mixer (gate only),
                     with their weights

Sizes are tiny (a few heads of 8-16 dims) but the sequences cross several chunks (gated delta: 64;
Mamba2: 16) and are longer than the conv kernels. Deterministic: re-running writes identical arrays.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import transformers
from transformers.models.falcon_h1 import modeling_falcon_h1 as fh
from transformers.models.granitemoehybrid import modeling_granitemoehybrid as gm
from transformers.models.lfm2 import modeling_lfm2 as lf
from transformers.models.qwen3_5 import modeling_qwen3_5 as qw

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "mixers"


def f32(t) -> np.ndarray:
    return t.detach().to(torch.float32).numpy().copy()


def conv_fixture(g: torch.Generator) -> dict:
    C, K, T = 6, 4, 11
    x = torch.randn(1, C, T, generator=g)
    w = torch.randn(C, K, generator=g)
    b = torch.randn(C, generator=g)
    full = qw.causal_conv1d_fn(x, w, b, activation=None)                     # (1, C, T)
    state = torch.zeros(1, C, K)   # transformers keeps K inputs; the update uses the last K - 1 of them
    steps = [qw.causal_conv1d_update(x[:, :, t:t + 1], state, w, b) for t in range(T)]
    return dict(x=f32(x[0].T), w=f32(w), b=f32(b), full=f32(full[0].T), steps=f32(torch.cat(steps, -1)[0].T))


def gated_delta_fixture(g: torch.Generator) -> dict:
    T, Hk, H, dk, dv = 150, 2, 4, 8, 16   # 150 tokens: three chunks of 64, the last padded
    q, k = torch.randn(1, T, Hk, dk, generator=g), torch.randn(1, T, Hk, dk, generator=g)
    v = torch.randn(1, T, H, dv, generator=g)
    gate = -torch.rand(1, T, H, generator=g) * 0.5                              # log decay in (-0.5, 0]
    beta = torch.rand(1, T, H, generator=g)
    s0 = torch.randn(1, H, dk, dv, generator=g) * 0.3
    o_chunk, s_chunk = qw.torch_chunk_gated_delta_rule(q, k, v, gate, beta, initial_state=s0.clone(),
                                                       output_final_state=True, use_qk_l2norm_in_kernel=True)
    o_rec, s_rec = qw.torch_recurrent_gated_delta_rule(q, k, v, gate, beta, initial_state=s0.clone(),
                                                       output_final_state=True, use_qk_l2norm_in_kernel=True)
    return dict(q=f32(q[0]), k=f32(k[0]), v=f32(v[0]), g=f32(gate[0]), beta=f32(beta[0]), state=f32(s0[0]),
                o_chunk=f32(o_chunk[0]), state_chunk=f32(s_chunk[0]), o_rec=f32(o_rec[0]), state_rec=f32(s_rec[0]))


def mamba2_fixture(g: torch.Generator) -> dict:
    T, H, P, G, N, L = 45, 4, 8, 2, 16, 16   # 45 tokens: chunks of 16, the last one short
    x = torch.randn(1, T, H, P, generator=g)
    dt = torch.randn(1, T, H, generator=g)
    A = -torch.rand(H, generator=g) * 4 - 0.5
    B, C = torch.randn(1, T, G, N, generator=g), torch.randn(1, T, G, N, generator=g)
    D, dt_bias = torch.randn(H, generator=g), torch.randn(H, generator=g) * 0.5
    s0 = torch.randn(1, H, P, N, generator=g) * 0.3
    y, s_end = gm.mamba2_chunk_scan(x, dt, A, B, C, chunk_size=L, D=D, dt_bias=dt_bias, dt_softplus=True,
                                    initial_states=s0.clone(), return_final_states=True)
    state, steps = s0.clone(), []
    for t in range(T):   # the module's decode call: per-head values expanded over P (and N for A)
        steps.append(gm.mamba2_selective_state_update(
            state, x[:, t], dt[:, t, :, None].expand(-1, -1, P), A[:, None, None].expand(-1, P, N), B[:, t], C[:, t],
            D[:, None].expand(-1, P), dt_bias=dt_bias[:, None].expand(-1, P), dt_softplus=True))
    return dict(x=f32(x[0]), dt=f32(dt[0]), A=f32(A), B=f32(B[0]), C=f32(C[0]), D=f32(D), dt_bias=f32(dt_bias),
                state=f32(s0[0]), chunk=np.int64(L), y=f32(y[0]), state_end=f32(s_end[0]),
                y_steps=f32(torch.stack(steps, 1)[0]), state_steps=f32(state[0]))


def randomise(module: torch.nn.Module, g: torch.Generator, std: float = 0.3):
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * std)


def layer_fixtures(g: torch.Generator) -> dict:
    out = {}
    cfg = transformers.Qwen3_5TextConfig(hidden_size=32, linear_num_key_heads=2, linear_num_value_heads=4,
                                         linear_key_head_dim=8, linear_value_head_dim=8, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, head_dim=8, vocab_size=10)
    m = qw.Qwen3_5GatedDeltaNet(cfg, 0)
    randomise(m, g)
    with torch.no_grad():
        m.A_log.copy_(torch.rand(4, generator=g) - 1)
    x = torch.randn(1, 70, 32, generator=g)
    with torch.no_grad():
        out["gdn_y"] = f32(m(x)[0])
    out["gdn_x"] = f32(x[0])
    out.update({f"gdn_{k}": f32(v) for k, v in m.state_dict().items()})

    cfg = transformers.Lfm2Config(hidden_size=16, conv_L_cache=3, conv_bias=True, num_hidden_layers=1,
                                  num_attention_heads=2, num_key_value_heads=1, vocab_size=10)
    m = lf.Lfm2ShortConv(cfg, 0)
    randomise(m, g)
    x = torch.randn(1, 9, 16, generator=g)
    with torch.no_grad():
        out["conv_y"] = f32(m(x)[0])
    out["conv_x"] = f32(x[0])
    out.update({f"conv_{k}": f32(v) for k, v in m.state_dict().items()})

    cfg = transformers.GraniteMoeHybridConfig(hidden_size=16, mamba_n_heads=4, mamba_n_groups=2, mamba_d_state=8,
                                              mamba_d_head=8, mamba_expand=2, mamba_chunk_size=8, num_hidden_layers=1,
                                              num_attention_heads=2, vocab_size=10)
    m = gm.GraniteMoeHybridMambaLayer(cfg, 0)
    randomise(m, g)
    x = torch.randn(1, 21, 16, generator=g)
    with torch.no_grad():
        out["granite_y"] = f32(m(x)[0])
    out["granite_x"] = f32(x[0])
    out.update({f"granite_{k}": f32(v) for k, v in m.state_dict().items()})

    cfg = transformers.FalconH1Config(hidden_size=16, mamba_n_heads=4, mamba_n_groups=1, mamba_d_state=8,
                                      mamba_d_ssm=32, mamba_d_head=8, mamba_chunk_size=8, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, vocab_size=10)
    m = fh.FalconH1Mixer(cfg, 0)
    randomise(m, g)
    m.register_buffer("mup_vector", torch.ones(1, 1, 2 * 32 + 2 * 8 + 4))
    x = torch.randn(1, 21, 16, generator=g)
    with torch.no_grad():
        out["falcon_y"] = f32(m(x)[0])
    out["falcon_x"] = f32(x[0])
    out.update({f"falcon_{k}": f32(v) for k, v in m.state_dict().items() if k != "mup_vector"})
    return out


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    for name, make in [("conv", conv_fixture), ("gated_delta", gated_delta_fixture), ("mamba2", mamba2_fixture),
                       ("layers", layer_fixtures)]:
        g = torch.Generator().manual_seed(1234)
        arrays = make(g)
        arrays["transformers_version"] = np.array(transformers.__version__)
        np.savez_compressed(OUT / f"{name}.npz", **arrays)
        print(name, sum(a.nbytes for a in arrays.values()), "bytes")


if __name__ == "__main__":
    main()
