#!/usr/bin/env python3
"""Runs the benchmark suite and prints the Markdown table of benches/README.md.

usage: python3 benches/report.py [--no-run]   (--no-run: tabulate the last `cargo bench` results)

Rows: workload x {forward, gradient}; columns: native Rust, zygvm interpreter, zygvm JIT, Lua 5.4,
LuaJIT interpreter, LuaJIT. Each cell is the median time per call and its ratio to native Rust
(for a `_loops` workload, the native reference of its vectorised twin). Cells for tiers that do
not exist yet say so; cells whose benchmark did not run (e.g. Lua not installed) are marked "-".
"""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CRITERION = os.path.join(ROOT, "target", "criterion")
WORKLOADS = ["sincos", "loop", "logsumexp", "logsumexp_loops", "logreg", "logreg_loops", "mlp", "mlp_loops"]
COLUMNS = [("native Rust", "native"), ("zygvm interp", "zygvm-interp"), ("zygvm JIT", None),
           ("Lua 5.4", "lua5.4"), ("LuaJIT -joff", "luajit-joff"), ("LuaJIT", "luajit")]


def median_seconds(group, name):
    path = os.path.join(CRITERION, group, name, "new", "estimates.json")
    try:
        with open(path) as f:
            return json.load(f)["median"]["point_estimate"] * 1e-9
    except (OSError, KeyError, ValueError):
        return None


def fmt(t):
    for unit, scale in (("s", 1), ("ms", 1e-3), ("µs", 1e-6), ("ns", 1e-9)):
        if t >= scale:
            return f"{t / scale:.3g} {unit}"
    return f"{t / 1e-12:.3g} ps"


def main():
    if "--no-run" not in sys.argv:
        subprocess.run(["cargo", "bench", "--bench", "workloads"], cwd=ROOT, check=True,
                       stdout=subprocess.DEVNULL)
    print("| workload | " + " | ".join(c for c, _ in COLUMNS) + " |")
    print("| --- " * (len(COLUMNS) + 1) + "|")
    for w in WORKLOADS:
        native = median_seconds("forward", f"{w.replace('_loops', '')}_native")
        for mode in ("forward", "gradient"):
            cells = []
            for _, key in COLUMNS:
                if mode == "gradient" or key is None:
                    cells.append("not built yet")
                    continue
                t = median_seconds("forward", f"{w}_{key}") if key != "native" else native
                if t is None:
                    cells.append("-")
                elif native and key != "native":
                    cells.append(f"{fmt(t)} ({t / native:.2f}×)")
                else:
                    cells.append(fmt(t))
            print(f"| {w} {mode} | " + " | ".join(cells) + " |")
    compile_t = median_seconds("compile", "generated_20k_lines")
    if compile_t:
        print(f"\nCompile time of a generated 20,000-line script: {fmt(compile_t)}.")


if __name__ == "__main__":
    main()
