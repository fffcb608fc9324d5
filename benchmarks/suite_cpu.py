"""The CPU-seconds a command (the README's test command) costs, by kind of process: runs the
command and reads /proc once a second for every process on the machine, then prints each kind's
CPU (user + system) and how many processes it had.

    .venv/bin/python benchmarks/suite_cpu.py -- .venv/bin/python -m pytest -q -n 3 \\
        --dist loadgroup tests

Unlike a sampling profiler (benchmarks/suite_profile.py), this counts only CPU the kernel
charged: a thread sleeping in C is never counted. What it misses: a process that lives less than a
second between two readings, and up to a second of each process's end. A process whose command
line reads empty at its last reading (a zombie) keeps the one read earlier.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

HZ = os.sysconf("SC_CLK_TCK")


def process_kind(cmdline: str) -> str:
    """The kind of a Python process of the test suite, from its command line."""
    if "sys.stdin.readline" in cmdline:
        return "test processes (xdist)"
    if "tests.launcher" in cmdline:  # a forked child keeps the zygote's command line
        return "the zygote and the strata processes it forked"
    if "service.cli worker" in cmdline or "strata worker" in cmdline:
        return "strata worker by exec (the local worker of a strata serve, its pool)"
    if "service.cli beat" in cmdline or "strata beat" in cmdline:
        return "strata beat by exec"
    if "service.cli" in cmdline or "bin/strata" in cmdline:
        return "other strata by exec (the README's first command, a documented command)"
    if "pytest" in cmdline:
        return "pytest controller"
    if "chrom" in cmdline:
        return "Chromium (the dashboard's tests)"
    if "beam" in cmdline or "rabbitmq" in cmdline:
        return "RabbitMQ"
    if "redis" in cmdline:
        return "Redis"
    return "other"


Key = tuple[int, int]  # pid, start time (a pid may be reused)


def readings() -> dict[Key, tuple[float, str]]:
    """(CPU seconds so far, command line) of every process now."""
    now: dict[Key, tuple[float, str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(
                errors="replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        now[(int(entry.name), int(fields[19]))] = (
            (int(fields[11]) + int(fields[12])) / HZ, cmdline.strip())
    return now


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="the command to run and measure, after --")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to measure after --")
    before = readings()
    last: dict[Key, tuple[float, str]] = {}
    started = time.monotonic()
    proc = subprocess.Popen(command)
    while True:
        ended = proc.poll() is not None
        for key, (cpu, cmdline) in readings().items():
            if not cmdline and key in last:
                cmdline = last[key][1]
            last[key] = (cpu, cmdline)
        if ended:
            break
        time.sleep(1.0)
    wall = time.monotonic() - started
    cpu_by: Counter[str] = Counter()
    count_by: Counter[str] = Counter()
    for key, (cpu, cmdline) in last.items():
        spent = cpu - before.get(key, (0.0, ""))[0]
        if spent > 0:
            kind = process_kind(cmdline)
            cpu_by[kind] += spent
            count_by[kind] += 1
    total = sum(cpu_by.values())
    print(f"\n{wall:8.1f} s wall, exit code {proc.returncode}; {total:.1f} CPU-s in all")
    for kind, cpu in cpu_by.most_common():
        print(f"{cpu:8.1f} CPU-s {100 * cpu / total:5.1f}%  {count_by[kind]:4d} processes  {kind}")
    sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
