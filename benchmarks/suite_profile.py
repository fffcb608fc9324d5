"""Where the test suite's CPU goes, by test module and by what the code was doing: reads the raw
(collapsed) output of py-spy recording the README's test command with its subprocesses.

    /path/to/py-spy record --subprocesses --nonblocking -r 25 -f raw -o build/prof/suite.txt -- \\
        .venv/bin/python -m pytest -q -n 3 --dist loadgroup tests
    .venv/bin/python benchmarks/suite_profile.py build/prof/suite.txt

(py-spy is not a dependency: `pip install --target /somewhere py-spy` puts it beside the
project, not in it.) A sample is a thread seen running or waiting for a core at one tick, so with
four test processes on two cores the seconds printed are thread-seconds, about twice the CPU
seconds: read them as shares. With `--nonblocking` py-spy cannot tell a thread sleeping in C
from a running one (a worker's parent-watch loop shows up), so the long-lived servers' and
workers' shares are upper bounds; benchmarks/suite_cpu.py counts the CPU each kind of process was
charged. Each stack is attributed three ways:

- by process: by its command line, as benchmarks/suite_cpu.py classifies it (the xdist test
  processes; the tests' zygote and the `strata` commands, servers and workers it forked; the
  `strata` workers, beats and other commands started by exec; the rest);
- by test module: the innermost frame in a `test_*.py` or `conftest.py` file (a fixture or test
  of that module; a forked process has none and counts under its process);
- by activity: the first of the frames named in ACTIVITIES found on the stack, innermost first.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.stack_shares import stacks  # noqa: E402  (py-spy's raw stacks, one parser)
from benchmarks.suite_cpu import process_kind as command_kind  # noqa: E402  (one classifier)

RATE = 25.0  # samples per second, as recorded above
# (name, substring of a frame): the first one found, innermost frame first, names the stack's
# activity.
ACTIVITIES = [
    ("garbage collection", "gc_collect"),
    ("Inductor compile", "torch/_inductor"),
    ("model load: Hugging Face model", "modeling_utils.py"),
    ("model load: tokenizer", "tokenization_utils_base.py"),
    ("model load: weight processing", "load_state_dict_into ("),
    ("model load: parity", "float32_parity ("),
    ("model load", "load_model (compute"),
    ("tuned lens training", "train_translators ("),
    ("sweep", "sweep (compute"),
    ("reference implementation", "(reference.py"),
    ("schema fuzzing", "hypothesis/"),
    ("DuckDB", "duckdb"),
    ("Celery / kombu", "celery/"),
    ("HTTP client", "httpx/"),
    ("API server", "litestar/"),
    ("collection", "collect ("),
    ("import", "<frozen importlib._bootstrap>"),
]
TEST_FILE = re.compile(r"\(((?:test_\w+|conftest)\.py):")


def process_kind(frames: list[str]) -> tuple[str, list[str]]:
    """The stack's process kind, and its frames below its own process frame."""
    marks = [i for i, f in enumerate(frames) if f.startswith("process ")]
    if not marks:
        return "unknown", frames
    end = marks[-1]  # a command line may hold ';' (python -c "a;b"): up to its closing quote
    while not frames[end].endswith('"') and end + 1 < len(frames):
        end += 1
    own, below = ";".join(frames[marks[-1]:end + 1]), frames[end + 1:]
    return command_kind(own), below


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("profile", type=Path, help="py-spy raw output")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    by_process: Counter[str] = Counter()
    by_module: Counter[str] = Counter()
    by_activity: Counter[str] = Counter()
    total = 0
    for frames, count in stacks(args.profile):
        total += count
        kind, own = process_kind(frames)
        by_process[kind] += count
        modules = [m.group(1) for f in own if (m := TEST_FILE.search(f))]
        by_module[modules[-1] if modules else f"({kind})"] += count
        inner_first = own[::-1]
        by_activity[next((name for name, part in ACTIVITIES
                          if any(part in f for f in inner_first)), "other")] += count
    print(f"{total / RATE:9.1f} thread-s sampled")
    for title, counter in (("process", by_process), ("test module", by_module),
                           ("activity", by_activity)):
        print(f"\nby {title}:")
        for name, count in counter.most_common(args.top):
            print(f"{count / RATE:9.1f}  {100 * count / total:5.1f}%  {name}")


if __name__ == "__main__":
    main()
