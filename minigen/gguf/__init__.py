"""A GGUF file -> a Hugging Face directory: the architecture table (what llama.cpp did to each family's
config and tensors, undone), the vocabulary rebuilt as a `tokenizers` file, and the streaming converter.

May import: load (families and the config reader, to check what it writes), errors, files; and the
`gguf` library, which reads the file and dequantises its tensors.
"""
