"""`generate --dump-attention`: a run's attention, the prompt's rows and each generated token's, streamed into
one of the dump's forms (dump.Form) as the forwards make it. A scan.Tap is the run's record (the engine's
streaming protocol, Sequence.record): each forward hands its weights over a few query rows at a time, the
prefill's and each decode step's one row, and the form's consumer (tiles.py) keeps its part of them, so no
step's maps are held and memory is the form's own arrays:

    full (default)          Triangles: each kept layer and head's lower triangle (Hk, T(T+1)/2)
    top (--attn-top-k K)    TopKeys and Thumbs: per row the first token's share, the K strongest other keys
                            and the weight not listed; each head's thumbnails
    rows (--attn-queries)   Window: the full rows of queries A..B

The run's rows T are known only when it ends (EOS, a stop string, the context), so the arrays are made for
the most it can give (the prompt and max_tokens - 1: the last token is never fed back) and cut to T: the
rows come in order, so a triangle, a top-keys array or a window cuts exactly. A thumbnail's blocks depend
on T, so when the run stopped early they are made again from one uncached pass over the T tokens
(scan.scan), as is everything when --attn-verify asks (bounded memory too).
"""
from __future__ import annotations

import numpy as np

from ..errors import MinigenError
from . import dump as D
from . import tiles as TL
from .args import attention_selection, selection
from .html import THUMB
from .scan import Tap, scan


class GenerationDump:
    """--dump-attention during generation: the path and the size checked before the run, the run's
    attention streamed (`attach(run)`), the file written when `finish` is called.

    with GenerationDump.for_run(run, path, top_k=8) as dump:
        dump.attach(run); ...; dump.finish()
    Leaving the block without finish() (an error, Ctrl-C) leaves no file behind.
    """

    def __init__(self, model, tokenizer, path, prompt_ids, max_tokens: int, layers: str | None = None,
                 heads: str | None = None, dtype: str | None = None, top_k: int | None = None,
                 queries: str | None = None, budget: int | None = None):
        c = model.config
        if max_tokens < 1:
            raise MinigenError("--dump-attention needs at least one generated token (-n 0 runs no forward pass); "
                               "for the prompt's attention alone use: minigen attention PROMPT --dump-attention OUT.npz")
        self.model, self.tokenizer, self.prompt = model, tokenizer, [int(i) for i in prompt_ids]
        self.layers = attention_selection(layers, c)
        self.heads = selection(heads, c.n_heads, "head", "--attn-heads")
        self.capacity = len(self.prompt) + max_tokens - 1     # rows the run can give: the last token gets none
        self.form = D.Form.of(self.capacity, dtype, top_k, queries)
        self.size = self.form.size(len(self.layers), len(self.heads), self.capacity, budget)
        self.file = D.DumpFile(path)
        self.kept = self.form.consumer(self.layers, len(self.heads), self.capacity)
        self.thumbs = self._thumbs(self.capacity) if self.form.name == "top" else None
        self.tap = Tap(c, self.layers, self.heads, [self.kept] + ([self.thumbs] if self.thumbs else []))
        self.generated: list[int] = []

    @classmethod
    def for_run(cls, run, path, layers: str | None = None, heads: str | None = None, dtype: str | None = None,
                top_k: int | None = None, queries: str | None = None):
        """For a generation.Run: room for the rows it can make (max_tokens, or what the context leaves)."""
        o = run.options
        return cls(run.model, run.tokenizer, path, run.prompt, min(o.max_tokens, o.max_context - len(run.prompt) + 1),
                   layers, heads, dtype, top_k, queries)

    def attach(self, run):
        """Stream the run's attention into the dump: the Tap as its record, each Step's token noted."""
        run.sequence.record = self.tap
        run.on_step.append(self.on_step)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self.file.__exit__(*exc)

    def on_step(self, step):
        self.generated.append(int(step.token))

    def _thumbs(self, T: int) -> TL.Thumbs:
        return TL.Thumbs(self.layers, len(self.heads), T, THUMB)

    def finish(self, verify: bool = False) -> dict:
        """Write the file; returns what was written (path, token_ids, form, queries for a window) and, with
        `verify`, the largest difference from an uncached recomputation (refused past the dtype's tolerance)."""
        ids = self.prompt + self.generated[:-1]
        T = len(ids)
        if self.form.name == "rows" and self.form.window[0] >= T:
            raise MinigenError(f"--attn-queries {self.form.window[0]}-{self.form.window[1] - 1}: the run stopped at "
                               f"{T} rows (queries 0-{T - 1}), before the window; no attention dump written")
        again = []                                            # consumers of one uncached pass over the T tokens
        thumbs = self.thumbs
        if thumbs is not None and T != self.capacity:
            thumbs = self._thumbs(T)
            again.append(thumbs)
        check = self.form.consumer(self.layers, len(self.heads), T) if verify else None
        again += [check] if check is not None else []
        if again:
            scan(self.model, ids, self.layers, self.heads, again)
        arrays = self.form.arrays(self.layers, self.kept, thumbs, T)
        final = None
        if self.generated:
            last = self.generated[-1]
            final = (last, self.tokenizer.token_strings([last])[0])
        extra = self.form.extra_meta()
        if "queries" in extra:
            extra["queries"] = [extra["queries"][0], min(extra["queries"][1], T)]
        meta = D.make_meta(self.model, self.tokenizer.token_strings(ids), self.layers, self.heads, self.form.dtype,
                           final, "generate", self.form.name, **extra)
        err = verify_arrays(self.form, arrays, self.form.arrays(self.layers, check, thumbs, T)) if verify else None
        self.file.write_arrays(arrays, ids, len(self.prompt), meta)
        return {"path": self.file.path, "token_ids": ids, "form": self.form.name, "verify": err,
                "queries": extra.get("queries")}


def verify_arrays(form: D.Form, got: dict, expect: dict) -> float:
    """Max |dumped - recomputed| over the weights (first token's share, listed and rest weights of a top-keys
    dump, compared by value: a near-tie may list another key), refused past what the dtype keeps: 1e-4 in
    float32, 2e-3 in float16."""
    names = [k for k in got if not k.startswith(("attention_top_keys_", "attention_thumbs_"))]
    err = max(float(np.abs(got[k].astype(np.float32) - expect[k].astype(np.float32)).max(initial=0)) for k in names)
    tol = 1e-4 if form.dtype.itemsize == 4 else 2e-3
    if err > tol:
        raise MinigenError(f"--attn-verify: dumped rows differ from the uncached recomputation by {err:.2e} (> {tol:g})")
    return err
