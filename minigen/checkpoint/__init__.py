"""What is this checkpoint? config.json in both spellings, the families as data, safetensors headers
validated, shards, the hub, the GGUF conversion cache and the default model: everything that turns a
path or a hub id into the engine's inputs (a Config and float32 params) and a tokenizer.

Named `checkpoint`, not `load`: `minigen.load` is the public function, which would hide a subpackage
of the same name.

May import: engine, text, gguf (the converter, for a .gguf given as a model), errors, files.
"""
