"""A GGUF file's matrices quantized again to another type by llama.cpp's own quantizer, for trying the types
no file on PyPI ships (Q2_K, Q3_K, IQ4_NL, IQ4_XS) on a real model:

    python scripts/requantize_gguf.py /work/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf out.gguf Q3_K
    minigen generate "def fib(n):" --model out.gguf -n 32 --temp 0            # as stored
    minigen generate "def fib(n):" --model out.gguf -n 32 --temp 0 --dtype float32

Each 2-D tensor whose rows are whole blocks of the type is dequantized (gguf-py) and quantized again with
`ggml_quantize_chunk` (what llama-quantize calls; no importance matrix), linked from the llama.cpp tree's
build/ggml/src/libggml-base.a as scripts/make_quant_fixtures.py does; the rest, and every metadata field,
is copied as it is. The values are the source's quantized twice: a file to test and time, not to use.

Needs: gcc and a built llama.cpp tree (--llama, default the one minigen's helpers build).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_quant_fixtures import LLAMA, build_driver   # noqa: E402


def quantize(exe: Path, tmp: Path, w: np.ndarray, kind: gguf.GGMLQuantizationType) -> np.ndarray:
    np.ascontiguousarray(w, np.float32).tofile(tmp / "x.f32")
    subprocess.run([str(exe), str(int(kind)), str(tmp / "x.f32"), str(tmp / "q.bin"), *map(str, w.shape)], check=True)
    return np.fromfile(tmp / "q.bin", np.uint8).reshape(len(w), -1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("dest", type=Path)
    ap.add_argument("type", help="a GGUF type name, e.g. Q3_K, Q2_K, IQ4_XS, IQ4_NL")
    ap.add_argument("--llama", type=Path, default=LLAMA, help="llama.cpp tree with build/ggml/src/libggml-base.a")
    args = ap.parse_args()
    kind = gguf.GGMLQuantizationType[args.type]
    block = gguf.GGML_QUANT_SIZES[kind][0]
    reader = gguf.GGUFReader(args.src)
    writer = gguf.GGUFWriter(args.dest, reader.get_field(gguf.Keys.General.ARCHITECTURE).contents())
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), field.types[0], sub_type=sub)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        exe = build_driver(args.llama, tmp)
        tensors, changed = [], 0
        for t in reader.tensors:
            data, ttype = t.data, t.tensor_type
            if len(t.shape) == 2 and int(t.shape[0]) % block == 0 and ttype not in (gguf.GGMLQuantizationType.F32,):
                w = gguf.quants.dequantize(np.asarray(t.data), ttype).reshape(int(t.shape[1]), int(t.shape[0]))
                data, ttype, changed = quantize(exe, tmp, w, kind), kind, changed + 1
            tensors.append((t.name, data, ttype))
        for name, data, ttype in tensors:
            writer.add_tensor_info(name, data.shape, data.dtype, data.nbytes, ttype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for _, data, _ in tensors:
            writer.write_tensor_data(np.asarray(data))
        writer.close()
    print(f"{args.dest}: {changed} of {len(reader.tensors)} tensors {args.type}, {args.dest.stat().st_size / 1e6:.0f} MB")


if __name__ == "__main__":
    main()
