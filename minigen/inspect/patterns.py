"""The attention command: where its patterns come from, the one pass that feeds everything one invocation
asks for, its views as plain data, and its files.

    Source        a prompt (whose maps are made while the scan runs, a few query rows at a time) or a dump
    AttentionAsk  one invocation's flags: which go together, and the Plan they make
    Plan          the consumers (tiles.py) of one scan for the view and the files asked, each file sized and
                  the memory counted before the forward pass: what cannot fit is refused with the size
    views         the census, one query's top keys for one head, one query's weight on one key everywhere
    probe         the induction probe (a short sequence of its own, its full maps)

A view's numbers are those of stats.py on the full maps (the tests hold them equal); only the census's
per-row numbers, one row's weights or one query's rows are kept, so a 4,096-token prompt's census needs
no map held. The value-weighted view (α_ij ‖v_j W_O‖, rows renormalised) and the first token hidden
apply to the printed view; files hold the plain weights (the full page toggles both itself).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from ..errors import MinigenError, ranges
from . import dump as D
from . import html as P
from . import stats
from . import tiles as TL
from .args import attention_selection, layer_head, position, selection
from .internals import induction_probe, value_norms
from .results import position_json, token_json
from .scan import forward_bytes, kept_bytes, scan, scan_maps, tile_bytes


# --- where the patterns come from ---------------------------------------------------------------------------

@dataclass
class Source:
    """Attention patterns over `tokens` and what made them: a prompt to run (`maps` None: the scan makes its
    maps tile by tile), or a dump ({layer: (Hk, T, T)} full maps, or its `top` keys, or its query `rows`)."""
    layers: list[int]             # the kept layers, all with attention
    heads: list[int]              # the kept query heads
    tokens: list[str]
    ids: np.ndarray
    prompt_length: int | None     # set for generation dumps: rows from there on are generated tokens
    subtitle: str
    model: object | None = None   # needed by a prompt, the value-weighted view and the probe
    tokenizer: object | None = None
    form: str = "prompt"          # "prompt", or the dump's: "full", "top", "rows"
    maps: dict | None = None      # a full dump's maps
    top: dict | None = None       # a top-keys dump's arrays per layer (dump.load_attention)
    mixers: list[str] | None = None   # each model layer's token mixer, when known
    path: str | None = None       # the dump's


def from_prompt(model, tok, ids, attn_layers: str | None, attn_heads: str | None) -> Source:
    c = model.config
    return Source(attention_selection(attn_layers, c), selection(attn_heads, c.n_heads, "head", "--attn-heads"),
                  tok.token_strings(ids), np.asarray(ids), None, str(model.path), model, tok,
                  mixers=[c.mixer(i) for i in range(c.n_layers)])


def from_dump(path, attn_layers: str | None, attn_heads: str | None) -> Source:
    """A dump, with --attn-layers and --attn-heads choosing among what it holds."""
    d = D.load_attention(path)
    m, form = d["meta"], d["form"]
    layers, heads = d["layers"], list(d["heads"])
    keep_l = _kept(attn_layers, m.get("n_layers", max(layers) + 1), sorted(layers), "layer", "--attn-layers", path)
    keep_h = _kept(attn_heads, m.get("n_heads", max(heads) + 1), heads, "head", "--attn-heads", path)
    rows = [heads.index(h) for h in keep_h]
    tokens = m.get("tokens") or [str(i) for i in d["token_ids"]]
    src = Source(keep_l, keep_h, tokens, d["token_ids"], d["prompt_length"], f"{m.get('model_path', '?')} · from {path}",
                 form=form, mixers=m.get("mixers"), path=str(path))
    if form == "top":
        return replace(src, top={l: {k: v[rows] for k, v in layers[l].items()} for l in keep_l})
    return replace(src, maps={l: layers[l][rows] for l in keep_l})


def dump_model_path(path) -> str | None:
    """The checkpoint a dump was made with, as its meta records it."""
    return D.load_attention(path)["meta"].get("model_path")


def _kept(text, n: int, present: list[int], what: str, flag: str, path) -> list[int]:
    if text is None:
        return present
    keep = selection(text, n, what, flag)
    missing = [i for i in keep if i not in present]
    if missing:
        raise MinigenError(f"{flag}: {what} {missing[0]} is not in {path} (it has {ranges(present)})")
    return keep


def with_model(src: Source, model, tok) -> Source:
    """A dump's patterns joined with the model that made them (checked as far as a dump allows: its layers,
    heads and token ids must exist in the model)."""
    c = model.config
    if max(src.layers) >= c.n_layers or max(src.heads) >= c.n_heads or int(np.max(src.ids)) >= c.vocab_size:
        raise MinigenError(f"{model.path} does not fit this dump ({c.n_layers} layers, {c.n_heads} heads, "
                           f"vocabulary {c.vocab_size}); give the model that made it with --model")
    return replace(src, model=model, tokenizer=tok)


def pattern_check(src: Source, layer: int, head: int):
    """--layer and --head naming a kept head of a kept layer; an error naming what the source holds otherwise."""
    if src.model is not None:
        layer_head(src.model.config, layer, head)
    if layer not in src.layers:
        raise MinigenError(f"--layer {layer} out of range (available: {ranges(src.layers)})")
    if head not in src.heads:
        raise MinigenError(f"--head {head} out of range (available: {ranges(src.heads)})")


# --- the views ------------------------------------------------------------------------------------------------

def census_result(src: Source, numbers: TL.RowNumbers, exclude_first: bool, weighted: bool,
                  probed: dict | None, sinks: TL.Sinks | None = None) -> dict:
    """The census of every kept layer x head from the scan's per-row numbers; with `probed`
    (internals.induction_probe), its scores too; value-weighted, with the plain sink beside (`sinks`)."""
    if len(src.tokens) < (3 if exclude_first else 2):
        raise MinigenError(f"the census needs at least {3 if exclude_first else 2} tokens "
                           f"(the first can only look at itself); this has {len(src.tokens)}")
    probe_part = None
    if probed is not None:
        probe_part = {"length": probed["n"], "prefix": [token_json(src.tokenizer, i) for i in probed["prefix"]],
                      "descriptions": stats.PROBE_SCORES,
                      "scores": {k: v[src.layers][:, src.heads] for k, v in probed["scores"].items()}}
    table = numbers.census(exclude_first)
    if weighted:
        table["sink_raw"] = sinks.sink()
    mixers = src.mixers or []
    return {"command": "attention", "view": "census", "source": src.subtitle, "tokens": src.tokens,
            "token_ids": src.ids, "layers": src.layers, "heads": src.heads, "exclude_first": exclude_first,
            # hybrids: layer -> its token mixer (Gated DeltaNet, short conv, Mamba2)
            "without_attention": {l: m for l, m in enumerate(mixers) if "attention" not in m},
            "value_weighted": weighted, "stats": table, "probe": probe_part}


def transforms(weighted: bool, exclude_first: bool) -> list[str]:
    return [name for name, on in (("value-weighted", weighted), ("first token hidden", exclude_first)) if on]


def top_keys_result(src: Source, layer: int, head: int, i: int, row: np.ndarray, k: int, view: list[str]) -> dict:
    order = np.argsort(-row, kind="stable")[:k]
    return {"command": "attention", "view": "top_keys", "layer": layer, "head": head, "transforms": view,
            "query": position_json(src.tokens, i), "n_keys": i + 1,
            "keys": [{**position_json(src.tokens, j), "weight": float(row[j])} for j in order],
            "others": 0.0 if len(order) == len(row) else float(max(0.0, 1.0 - row[order].sum()))}


def query_grid_result(src: Source, i: int, j: int, weights: np.ndarray, view: list[str]) -> dict:
    """One query's weight on one key in every kept layer and head."""
    return {"command": "attention", "view": "query_grid", "transforms": view,
            "query": position_json(src.tokens, i), "key": position_json(src.tokens, j),
            "layers": src.layers, "heads": src.heads, "weights": weights}


def probe(model, tok, length: int | None, seed: int, first: str | None, attn_layers: str | None = None,
          attn_heads: str | None = None) -> dict:
    """The induction probe: prefix + r + r, every score of stats.PROBE_SCORES, for the kept layers and heads."""
    c = model.config
    layers = attention_selection(attn_layers, c)
    heads = selection(attn_heads, c.n_heads, "head", "--attn-heads")
    p = induction_probe(model, tok, length, seed, first)
    return {"command": "attention", "view": "probe", "length": p["n"], "seed": seed,
            "prefix": [token_json(tok, i) for i in p["prefix"]], "token_ids": p["ids"], "layers": layers,
            "heads": heads, "scores": {k: v[layers][:, heads] for k, v in p["scores"].items()},
            "descriptions": stats.PROBE_SCORES}


# --- one scan for everything asked ----------------------------------------------------------------------------

@dataclass
class Plan:
    """The consumers of one scan: `plain` get the weights, `view` the printed view's (value-weighted when
    asked); `parts` names them for what comes after ("census", "sinks", "pick", "cells", the files')."""
    src: Source
    plain: list = field(default_factory=list)
    view: list = field(default_factory=list)
    parts: dict = field(default_factory=dict)
    weighted: bool = False
    keep: bool = False
    full_norms: bool = False      # the full page's value-weighted toggle: the norms of every kept layer
    need: dict = field(default_factory=dict)   # bytes by what holds them, counted before the forward

    def add(self, name: str, consumer, view: bool = False):
        self.parts[name] = consumer
        (self.view if view else self.plain).append(consumer)
        return consumer

    def run(self):
        """The scan (or, from a full dump, its maps through the same consumers); the Kept queries and keys
        when the plan keeps them (--serve)."""
        src = self.src
        if src.form == "top" or not (self.plain or self.view):
            return None
        if self.full_norms:
            self.parts["norms"] = {}
        if src.form == "prompt":
            return scan(src.model, src.ids, src.layers, src.heads, self.plain, self.view, self.weighted,
                        keep=self.keep, norms=self.parts.get("norms"))
        norms = self.dump_norms() if self.weighted or self.full_norms else None
        if self.full_norms:
            self.parts["norms"] = norms
        scan_maps(src.maps, self.plain, self.view, norms if self.weighted else None)
        return None

    def dump_norms(self) -> dict:
        n = value_norms(self.src.model, self.src.ids)                           # (L, H, T)
        return {l: n[l][self.src.heads] for l in self.src.layers}


def available_memory() -> int | None:
    """Bytes the system could still give (MemAvailable), or None where /proc/meminfo is not to be had."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_memory(need: dict, available: int | None = None):
    """Refuse, before any forward pass, a plan whose parts would need more memory than the system has."""
    available = available_memory() if available is None else available
    total = sum(need.values())
    if available is not None and total > 0.9 * available:
        parts = ", ".join(f"{name} {size / 2**30:.2f}" for name, size in need.items() if size >= 2**26)
        raise MinigenError(f"this would need about {total / 2**30:.1f} GiB of memory ({parts} GiB), and "
                           f"{available / 2**30:.1f} GiB is available; keep less with --attn-layers, --attn-heads, "
                           f"fewer tokens, or without --serve")


# --- the attention command: which flags go together, the plan, the files -------------------------------------

@dataclass
class AttentionAsk:
    """What one `minigen attention` invocation asks for (its flags, by name)."""
    prompt: str | None = None           # the prompt's text (None: --from or --probe alone)
    from_path: str | None = None
    model_path: str | None = None
    chat: bool = False
    layer: int | None = None
    head: int | None = None
    token: str | None = None
    key: str | None = None
    top_k: int = 10
    value_weighted: bool = False
    exclude_first: bool = False
    probe: str | None = None
    probe_length: int | None = None
    probe_first: str | None = None
    seed: int = 0
    html_path: str | None = None
    dump_path: str | None = None
    attn_layers: str | None = None
    attn_heads: str | None = None
    attn_dtype: str | None = None
    attn_top_k: int | None = None
    attn_queries: str | None = None
    html_form: str | None = None
    serve: bool = False
    port: int | None = None

    @property
    def uses_model(self) -> bool:
        """Whether a dump needs its model too (the dump holds the weights, not the values)."""
        return self.value_weighted or self.probe is not None

    @property
    def probe_alone(self) -> bool:
        return self.prompt is None and self.from_path is None

    def conflict(self) -> str | None:
        """The first flags given together that do not go together, as a usage message; None if none."""
        rules = [
            (self.token is not None and self.key is None and (self.layer is None or self.head is None),
             "--token needs --layer and --head (one head's top keys) or --key (every layer x head)"),
            (self.key is not None and (self.token is None or self.layer is not None or self.head is not None),
             "--key goes with --token, without --layer/--head"),
            (self.prompt is not None and self.from_path is not None,
             "give either a PROMPT or --from DUMP.npz, not both"),
            (self.from_path is not None and self.chat, "--chat renders a PROMPT; a dump's tokens are already fixed"),
            (self.from_path is not None and self.dump_path is not None,
             "--dump-attention writes a new dump from a PROMPT; with --from the dump exists"),
            (self.attn_dtype is not None and self.dump_path is None, "--attn-dtype goes with --dump-attention"),
            (self.attn_top_k is not None and self.dump_path is None,
             "--attn-top-k goes with --dump-attention (the page keeps each row's strongest keys by itself)"),
            (self.attn_queries is not None and self.dump_path is None, "--attn-queries goes with --dump-attention"),
            (self.attn_queries is not None and self.attn_top_k is not None,
             "--attn-queries dumps full rows, --attn-top-k every row's strongest keys: choose one"),
            (self.html_form is not None and self.html_path is None and not self.serve,
             "--html-form goes with --html or --serve"),
            (self.port is not None and not self.serve, "--port goes with --serve"),
            (self.serve and self.from_path is not None,
             "--serve recomputes rows from a prompt's queries and keys: give a PROMPT, not --from"),
            (self.serve and self.probe_alone, "--serve shows a PROMPT's attention: give one"),
            (self.from_path is not None and self.model_path is not None and not self.uses_model,
             "--model with --from is used only by --value-weighted and --probe (the dump holds the weights)"),
            ((self.probe_length is not None or self.probe_first is not None) and self.probe is None,
             "--probe-length and --probe-first go with --probe induction"),
            (self.probe is not None and self.token is not None,
             "--probe adds columns to the census, not to --token's views"),
            (self.probe_alone and self.probe is None,
             "give a PROMPT (or - to read stdin), or --from DUMP.npz, or --probe induction"),
        ]
        return next((message for given, message in rules if given), None)

    def source(self, load, prompt_ids) -> Source:
        """The patterns to look at: from the dump (joined with its model when a view needs it) or from the
        prompt (not run yet). `load(model_path) -> (model, tokenizer)`; `prompt_ids(model, tokenizer) -> ids`,
        checked. A bad --layer/--head/--token fails here, before any file is written."""
        if self.from_path is not None:
            src = from_dump(self.from_path, self.attn_layers, self.attn_heads)
            if self.uses_model:
                src = with_model(src, *load(self.model_path or dump_model_path(self.from_path)))
        else:
            model, tok = load(self.model_path)
            src = from_prompt(model, tok, prompt_ids(model, tok), self.attn_layers, self.attn_heads)
        if self.layer is not None or self.head is not None:
            pattern_check(src, self.layer if self.layer is not None else min(src.layers),
                          self.head if self.head is not None else src.heads[0])
        return src

    def prints_view(self, files) -> bool:
        """Whether a view is printed: always but when files (or --serve) were asked for and no view flag
        (then, with --json, only what was written)."""
        return not files or self.token is not None or self.probe is not None or self.value_weighted or \
            self.exclude_first

    def page_form(self, src: Source) -> str:
        """The page's form: as asked, or (auto) the full one while it stays small, and always from a full dump
        that small; compact from a top-keys dump."""
        if src.form == "top":
            if self.html_form == "full":
                raise MinigenError(f"{src.path} holds each row's top keys, not every weight: its page is compact "
                                   f"(--html-form compact, or leave --html-form out)")
            return "compact"
        if self.html_form in ("full", "compact"):
            return self.html_form
        return "full" if P.html_size(len(src.layers), len(src.heads), len(src.tokens)) <= P.AUTO_FULL_BYTES else "compact"

    def plan(self, src: Source, files: set[str]) -> Plan:
        """The consumers for the view and the files asked (`files`: "dump", "html", "serve"), every size checked."""
        if src.form == "rows":
            raise MinigenError(f"{src.path} holds the full rows of a window of queries only (--attn-queries): "
                               f"read it with minigen.inspect.load_attention")
        plan = Plan(src, weighted=self.value_weighted)
        T, Lk, Hk = len(src.tokens), len(src.layers), len(src.heads)
        if src.form == "prompt":
            plan.need["forward pass"] = forward_bytes(src.model.config, T) + 2 * tile_bytes(Hk, T)
        self._view_consumers(plan, src, files)
        if "dump" in files:
            self._dump_consumers(plan, src)
        if "html" in files or "serve" in files:
            self._page_consumers(plan, src)
        if "serve" in files:
            plan.keep = True
            plan.need["kept queries and keys"] = kept_bytes(src.model.config, T, Lk)
        check_memory(plan.need)
        return plan

    def _view_consumers(self, plan: Plan, src: Source, files: set[str]):
        T, Lk, Hk = len(src.tokens), len(src.layers), len(src.heads)
        if self.token is None:
            if not self.prints_view(files):
                return
            if src.form == "top":
                raise MinigenError(f"the census needs every weight; {src.path} holds each row's top keys "
                                   f"(--attn-top-k): --html makes its page, minigen.inspect.load_attention reads it")
            plan.add("census", TL.RowNumbers(src.layers, Hk, src.ids), view=True)
            plan.need["census rows"] = len(TL.ROW_NUMBERS) * Lk * Hk * T * 8
            if self.value_weighted:
                plan.add("sinks", TL.Sinks(src.layers, Hk, T))
            return
        if src.form == "top":
            raise MinigenError(f"--token needs every weight of its row; {src.path} holds each row's top keys only")
        i = position(src.tokens, self.token)
        if self.key is not None:
            plan.parts["key"] = position(src.tokens[:i + 1], self.key, "--key")
            plan.add("cells", TL.Cells(src.layers, Hk, i), view=True)
        else:
            plan.add("pick", TL.Pick(self.layer, src.heads.index(self.head), i), view=True)
        plan.parts["query"] = i

    def _dump_consumers(self, plan: Plan, src: Source):
        T, Lk, Hk = len(src.tokens), len(src.layers), len(src.heads)
        form = D.Form.of(T, self.attn_dtype, self.attn_top_k, self.attn_queries)
        plan.need["dump"] = form.size(Lk, Hk, T)
        plan.add("dump", form.consumer(src.layers, Hk, T))
        if form.name == "top":
            self._thumbs(plan, src)
            plan.need["dump"] += Lk * Hk * T * form.top_k * 8
        plan.parts["dump form"] = form

    def _page_consumers(self, plan: Plan, src: Source):
        T, Lk, Hk = len(src.tokens), len(src.layers), len(src.heads)
        form = self.page_form(src)
        plan.parts["page form"] = form
        if form == "full":
            size = P.check_full_size(Lk, Hk, T)
            plan.add("page", TL.Triangles(src.layers, Hk, T, np.float16))
            plan.full_norms = src.model is not None
            plan.need["page"] = size * 4
            return
        if src.form == "top":
            plan.need["page"] = 4 * P.COMPACT_PAGE_BYTES
            return
        plan.add("page", TL.StrongKeys(src.layers, Hk, T, P.TOP_K, P.FLOOR))
        self._thumbs(plan, src)
        plan.need["page"] = Lk * Hk * T * (8 + 12 * P.TOP_K) + 4 * P.COMPACT_PAGE_BYTES

    def _thumbs(self, plan: Plan, src: Source):
        if "thumbs" not in plan.parts:
            plan.add("thumbs", TL.Thumbs(src.layers, len(src.heads), len(src.tokens), P.THUMB))

    def view(self, src: Source, plan: Plan) -> dict:
        """The printed view from what the scan kept: the census, one row's top keys, one query's grid."""
        view = transforms(self.value_weighted, self.exclude_first)
        parts = plan.parts
        if "census" in parts:
            probed = induction_probe(src.model, src.tokenizer, self.probe_length, self.seed, self.probe_first) \
                if self.probe else None
            return census_result(src, parts["census"], self.exclude_first, self.value_weighted, probed, parts.get("sinks"))
        i = parts["query"]
        if "cells" in parts:
            rows = parts["cells"].rows                                       # (Lk, Hk, i + 1)
            rows = stats.hide_first(rows) if self.exclude_first else rows
            return query_grid_result(src, i, parts["key"], rows[..., parts["key"]], view)
        row = parts["pick"].row
        row = stats.hide_first(row) if self.exclude_first else row
        return top_keys_result(src, self.layer, self.head, i, row, self.top_k, view)


def write_dump(src: Source, plan: Plan, out: D.DumpFile) -> dict:
    form = plan.parts["dump form"]
    meta = D.make_meta(src.model, src.tokens, src.layers, src.heads, form.dtype, None, "attention", form.name,
                       **form.extra_meta())
    out.write_arrays(form.arrays(src.layers, plan.parts["dump"], plan.parts.get("thumbs")), src.ids, len(src.ids), meta)
    return {"path": str(out.path), "form": form.name, "layers": len(src.layers), "heads": len(src.heads),
            "tokens": len(src.tokens)}


def render_page(src: Source, plan: Plan, layer: int | None, head: int | None, server: dict | None = None) -> str:
    """The page of what the scan kept (or of a top-keys dump), in the plan's form."""
    select = (layer if layer is not None else min(src.layers), head if head is not None else src.heads[0])
    common = dict(prompt_length=src.prompt_length, subtitle=src.subtitle, select=select, mixers=src.mixers)
    if plan.parts["page form"] == "full":
        norms = plan.parts.get("norms") or None
        return P.render_full(plan.parts["page"].tri, src.heads, src.tokens, value_norms=norms, **common)
    if src.form == "top":
        rows = {l: top_rows(src.top[l]) for l in src.layers}
        thumbs = {l: (src.top[l]["thumbs"], src.top[l]["thumbs_hidden"]) for l in src.layers}
    else:
        strong, th = plan.parts["page"], plan.parts["thumbs"]
        rows = {l: (strong.first[n], *strong.rows_of(l)) for n, l in enumerate(src.layers)}
        thumbs = {l: (th.plain[n], th.hidden[n]) for n, l in enumerate(src.layers)}
    return P.render_compact(rows, thumbs, src.heads, src.tokens, server=server, **common)


def top_rows(top: dict) -> tuple:
    """A top-keys dump's layer as the compact page's rows: its listed keys that the page's rule keeps (at
    least html.FLOOR of the row beyond the first token, at most html.TOP_K), in key order."""
    keys, weights, first = top["keys"], top["weights"], top["first"]
    others = np.maximum(1 - first, 1e-30)[..., None]
    keep = (keys > 0) & (weights >= P.FLOOR * others)
    keep &= np.cumsum(keep, axis=-1) <= P.TOP_K                              # listed strongest first
    order = np.argsort(np.where(keep, keys, np.iinfo(np.int32).max), axis=-1, kind="stable")
    k, w, on = (np.take_along_axis(a, order, -1) for a in (keys, weights, keep))
    return first, on.sum(-1), k[on], w[on]


def write_page(text: str, out) -> dict:
    out.tmp.write_text(text, encoding="utf-8")
    out.commit()
    return {"path": str(out.path), "bytes": len(text.encode("utf-8"))}
