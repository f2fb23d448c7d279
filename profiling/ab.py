#!/usr/bin/env python3
"""A/B benchmark of kiln builds in a balanced order.

    python3 profiling/ab.py [-n ROUNDS] [-o OUT.jsonl] BUILD_A BUILD_B [...] -- BENCH ARGS

runs `BUILD bench BENCH ARGS -o jsonl` for each build, ROUNDS times (default 3), in an order that
gives no build the same place every round (A B, B A, A B, ... for two builds; rotations for
more), and prints each build's tok/s per model and test: every sample in run order, the mean
and the spread. Why: on one GPU machine the first of two runs can lean one way (H200 runs
379-384 ran the old build first every time; run 384, in mixed order, separated what they
could not), and hosts of the same GPU differ by several percent, so only builds compared in
one call and in a balanced order say which is faster.

Example (two builds and TinyLlama pp512 and tg128):
    python3 profiling/ab.py ./kiln-base ./kiln -- -m tl.gguf -p 512 -n 128 -r 3
"""

import argparse
import json
import statistics
import subprocess
import sys


def orders(n, rounds):
    """Round r runs the builds (indices) rotated by r (two builds: A B, B A, A B, ...)."""
    for r in range(rounds):
        yield [(i + r) % n for i in range(n)]


def run(build, bench_args):
    """One `bench` run of `build`: its JSON lines (one per model and test)."""
    cmd = [build, "bench", *bench_args, "-o", "jsonl"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"ab: {' '.join(cmd)} failed ({out.returncode}): {out.stderr.strip()}")
    rows = []
    for line in out.stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            rows.append(json.loads(line))
    if not rows:
        sys.exit(f"ab: {' '.join(cmd)} printed no JSON lines")
    return rows


def model_name(row):
    m = row.get("model", "")
    if isinstance(m, dict):
        return m.get("name") or m.get("path") or "?"
    return str(m)


def test_name(row):
    t = row.get("test", "?")
    depth = row.get("n_depth") or 0
    return f"{t} @ d{depth}" if depth and "@" not in t else t


def main():
    argv = sys.argv[1:]
    if "--" not in argv:
        sys.exit(__doc__)
    split = argv.index("--")
    p = argparse.ArgumentParser(description="A/B kiln builds in a balanced order")
    p.add_argument("-n", "--rounds", type=int, default=3)
    p.add_argument("-o", "--out", help="also write every JSON line, tagged with its build and round")
    p.add_argument("builds", nargs="+")
    a = p.parse_args(argv[:split])
    bench_args = argv[split + 1:]
    if len(a.builds) < 2:
        sys.exit("ab: give at least two builds")

    # Builds by letter, so that one build given twice (an A/A run, to see the noise) stays two.
    labels = [f"{chr(ord('A') + i)} {b}" for i, b in enumerate(a.builds)]
    samples = {}  # (model, test) -> label -> [tok/s]
    tagged = []
    for r, order in enumerate(orders(len(a.builds), a.rounds)):
        for i in order:
            for row in run(a.builds[i], bench_args):
                key = (model_name(row), test_name(row))
                samples.setdefault(key, {}).setdefault(labels[i], []).append(row["avg_ts"])
                tagged.append({"build": labels[i], "round": r, **row})
    if a.out:
        with open(a.out, "w") as f:
            for row in tagged:
                f.write(json.dumps(row) + "\n")

    order_text = " | ".join(" ".join(labels[i][0] for i in o) for o in orders(len(a.builds), a.rounds))
    print("builds: " + ", ".join(labels))
    print(f"order: {order_text}")
    base = labels[0]
    for (model, test), by_build in samples.items():
        print(f"\n{model} {test}")
        base_mean = statistics.mean(by_build[base]) if base in by_build else None
        for label in labels:
            v = by_build.get(label, [])
            if not v:
                continue
            mean = statistics.mean(v)
            rel = f" ({mean / base_mean - 1:+.1%} against A)" if base_mean and label != base else ""
            each = " / ".join(f"{x:,.0f}" for x in v)
            print(f"  {label[0]}: {each}; mean {mean:,.1f}, spread {min(v):,.0f}-{max(v):,.0f}{rel}")


if __name__ == "__main__":
    main()
