"""What is this checkpoint directory? config.json in both spellings (config.py, with fields.py's typed reads
and rope.py's RoPE settings), the families as data (families.py, their config.json quirks in
family_configs.py, the tensor fixes in fixes.py),
safetensors headers validated, shards, and the weights as float32 arrays in minigen's layout, or 16-bit ones
kept as stored (weights.py; stored.py: quantized at load, counted):
everything that turns a Hugging Face directory's files into the engine's inputs (a Config and params).
A GGUF file or a hub id becomes such a directory first (minigen/gguf/, minigen/resolve.py).

Named `checkpoint`, not `load`: `minigen.load` is the public function, which would hide a subpackage
of the same name.

May import: engine, errors, files.
"""
