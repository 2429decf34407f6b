"""The fault corpus: seeded cases of hostile and unlucky input, by input kind, and the runner that runs each
against minigen as a user would and classifies what happened (scripts/fault_inject.py is its command line;
tests/test_faults.py runs the CI subset and tests the runner itself).

    core.py              Run, Case, and the helpers that build a case's files from tests/fixtures
    checkpoint_files.py  safetensors files, shard indexes, and non-files where a checkpoint's files should be
    configs.py           config.json and generation_config.json
    tokenizer_files.py   tokenizer.json, tokenizer_config.json, chat_template.jinja
    templates.py         hostile chat templates
    flags.py             command-line flags, prompts, output targets; the Python API
    processes.py         signals and streams, in real processes
    gguf_files.py        GGUF metadata and bytes (behind --gguf)
    runner.py            all_cases, fast_cases, classify, run_cases, summary, main
"""
