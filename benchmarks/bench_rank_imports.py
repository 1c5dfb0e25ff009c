"""Where a rank's imports go: every module a Trainer rank imports at start (slurmkit.worker.rank,
submitit's worker, then the train task's modules, as a restart pays them), from `python -X
importtime`, summed by top-level package, against a bare `import torch, torch._dynamo` (the floor
every rank pays: torch's optimizers import Dynamo at first use), measured in the same run.

    python benchmarks/bench_rank_imports.py [--runs 3] [--top 25] [--all FILE]

--all writes every module a rank imports, with its self and cumulative time, to FILE (TSV).
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
from collections import Counter
from pathlib import Path

RANK = ("import slurmkit.worker.rank, submitit.core.submission, slurmkit.worker.entry, "
        "slurmkit.worker.train.tasks.train_task, torch._dynamo")
FLOOR = "import torch, torch._dynamo"
LINE = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \|(\s*)(\S+)")


def timed(code: str, listing: list[str] | None = None) -> tuple[float, Counter[str], dict[str, int]]:
    """(seconds in all, self microseconds by top-level package, self microseconds by module);
    `listing` gets every module as `module<TAB>self us<TAB>cumulative us`."""
    proc = subprocess.run([sys.executable, "-P", "-X", "importtime", "-c", code], capture_output=True, text=True,
                          check=True)
    by_package: Counter[str] = Counter()
    by_module: dict[str, int] = {}
    total = 0
    for line in proc.stderr.splitlines():
        if m := LINE.match(line):
            own, module = int(m.group(1)), m.group(4)
            if listing is not None:
                listing.append(f"{module}\t{own}\t{m.group(2)}")
            by_package[module.split(".")[0]] += own
            by_module[module] = own
            total += own
    return total / 1e6, by_package, by_module


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--all", metavar="FILE", help="every module a rank imports, with its times, as TSV")
    args = parser.parse_args()
    floors, ranks = [], []
    last_rank: tuple[float, Counter[str], dict[str, int]] | None = None
    last_floor: tuple[float, Counter[str], dict[str, int]] | None = None
    for _ in range(args.runs):  # alternating, so the machine's drift falls on both alike
        last_floor = timed(FLOOR)
        last_rank = timed(RANK)
        floors.append(last_floor[0])
        ranks.append(last_rank[0])
    assert last_rank is not None and last_floor is not None
    if args.all:
        listing = ["module\tself_us\tcumulative_us"]
        timed(RANK, listing)
        Path(args.all).write_text("\n".join(listing) + "\n")
    floor, rank = statistics.median(floors), statistics.median(ranks)
    print(f"a Trainer rank's imports: {rank:.2f} s ({len(last_rank[2])} modules); the floor "
          f"(torch, torch._dynamo): {floor:.2f} s ({len(last_floor[2])} modules); ratio {rank / floor:.2f}")
    extra: Counter[str] = Counter()
    for module, us in last_rank[2].items():
        if module not in last_floor[2]:
            extra[module.split(".")[0]] += us
    print(f"modules beyond the floor's, by top-level package (self time, last run; {sum(extra.values()) / 1e6:.2f} s):")
    for package, us in extra.most_common(10):
        print(f"  {package:28s} {us / 1e3:8.1f} ms")
    print(f"the {args.top} slowest modules of a rank (self time, last run):")
    for module, us in sorted(last_rank[2].items(), key=lambda kv: -kv[1])[:args.top]:
        print(f"  {module:60s} {us / 1e3:8.1f} ms{'' if module in last_floor[2] else '  (beyond the floor)'}")


if __name__ == "__main__":
    main()
