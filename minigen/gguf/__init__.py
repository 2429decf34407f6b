"""A GGUF file -> a Hugging Face directory: typed reads of its metadata and the fields every family has
(arch.py; what is particular to a family, what llama.cpp made of it, is its entry in families.py), the vocabulary rebuilt
as a `tokenizers` file (vocab.py), the streaming converter (convert.py), a GGUF run as stored, its params
built straight from the file (direct.py), and a GGUF's files made once in the weights directory, the default
model's conversion included (cache.py, default_model.py).

May import: checkpoint (the families, and the config reader and weight resolver, to check what it writes),
engine (direct.py: the StoredMatrix it builds), errors, files; and the `gguf` library, which reads the file and
dequantises its tensors.
"""
