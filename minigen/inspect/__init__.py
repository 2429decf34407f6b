"""Looking inside attention: dumps, per-head statistics, the step-by-step trace, an HTML picture.

    dump.py       the .npz format: selection, size budget, assembly from per-step records, load_attention
    stats.py      census statistics and the induction score, on plain arrays
    trace.py      one head's arithmetic step by step (the seeds' walk-through), pure
    internals.py  running a loaded model part way with model.py's own functions
    report.py     terminal text: census table, top-k bars
    html.py       the self-contained page
"""
from .dump import Recorder, load_attention
from .html import render_html
from .stats import census, head_stats, induction_score
from .trace import Steps, attention_steps, format_steps

__all__ = ["load_attention", "Recorder", "render_html", "census", "head_stats", "induction_score",
           "attention_steps", "format_steps", "Steps"]
