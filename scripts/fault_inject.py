"""Seeded fault injection: corrupted checkpoints, odd options, hostile chat templates, signals and broken
streams, all derived from the fixtures in tests/fixtures, run against minigen as a user would run it.

    python scripts/fault_inject.py                 # the full corpus: counts per category and outcome
    python scripts/fault_inject.py --fast          # the CI subset (tests/test_faults.py runs it)
    python scripts/fault_inject.py --seed 7        # another corpus: the seed picks tensors, offsets, values
    python scripts/fault_inject.py -k template -v  # only cases whose name contains 'template'; show each
    python scripts/fault_inject.py --gguf          # add corrupted GGUFs (metadata values; llama.cpp's files
                                                   # damaged field by field) for `convert` and `--model F.gguf`

The cases and the runner live in tests/faults/ (one module per input kind: checkpoint files, configs,
tokenizer files, templates, flags and the API, processes, GGUF files; runner.py runs and classifies).
Each case builds its files in a fresh temporary directory and runs one command (`minigen ...` in a
forked child with limits on time and memory, a Python API call, or a real `python -m minigen` process
for signals and closed or full streams). Outcomes:

    ok-error   a one-line `minigen: error: ...` (or click's usage error, exit 2) and the right exit code
    ok         exit 0 where that is allowed, and the result checks out
    traceback  a Python traceback or a Rust panic on stderr
    hang       over the time limit, or out of memory (MemoryError or killed)
    wrong      exit 0 where the input must be refused, a wrong exit code, an error of several lines,
               a file read outside the checkpoint or bytes of it printed, a temporary file left behind

Nothing is written outside the temporary directories: device and FIFO targets are clones made there
(`mknod`, `mkfifo`), and "disk full" is a file-size limit (RLIMIT_FSIZE), not /dev/full.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from faults.runner import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(description=__doc__.split("\n\n")[0]))
