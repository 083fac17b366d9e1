#!/usr/bin/env python3
"""Runs the benchmark suite and prints the Markdown table of benches/README.md.

usage: python3 benches/report.py [--no-run]   (--no-run: tabulate the last `cargo bench` results)

Rows: workload x {forward, gradient}; columns: native Rust, zygvm interpreter, zygvm JIT, Lua 5.4,
LuaJIT interpreter, LuaJIT. Each cell is the median time per call and its ratio to native Rust
(a `_loops` forward row: the same loops in plain Rust, summing in the Zy code's order; a
`_loops` gradient row: the hand-written gradient of its vectorised twin). Cells for tiers that do not exist yet say so; cells
whose benchmark did not run (e.g. Lua not installed) are marked "-". Then: gradient/forward
overhead, tape bytes per iteration (`zygvm --stats`), time to first gradient (fresh process).
"""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CRITERION = os.path.join(ROOT, "target", "criterion")
WORKLOADS = ["sincos", "loop", "logsumexp", "logsumexp_loops", "logreg", "logreg_loops", "mlp", "mlp_loops"]
# Timed forward only (integer recursion: the cost of calls).
FORWARD_ONLY = ["fib"]
COLUMNS = [("native Rust", "native"), ("zygvm interp", "zygvm-interp"), ("zygvm JIT", "zygvm-jit"),
           ("Lua 5.4", "lua5.4"), ("LuaJIT -joff", "luajit-joff"), ("LuaJIT", "luajit")]


def median_seconds(group, name):
    path = os.path.join(CRITERION, group, name, "new", "estimates.json")
    try:
        with open(path) as f:
            return json.load(f)["median"]["point_estimate"] * 1e-9
    except (OSError, KeyError, ValueError):
        return None


def fmt(t):
    # A time that rounds up to 1000 of a unit at three digits takes the next unit
    # (999.7 ns is "1 µs", not "1e+03 ns").
    for unit, scale in (("s", 1), ("ms", 1e-3), ("µs", 1e-6), ("ns", 1e-9)):
        if t >= scale * 0.9995:
            return f"{t / scale:.3g} {unit}"
    return f"{t / 1e-12:.3g} ps"


def main():
    if "--no-run" not in sys.argv:
        subprocess.run(["cargo", "bench", "--bench", "workloads"], cwd=ROOT, check=True,
                       stdout=subprocess.DEVNULL)
    print("| workload | " + " | ".join(c for c, _ in COLUMNS) + " |")
    print("| --- " * (len(COLUMNS) + 1) + "|")
    for w in WORKLOADS + FORWARD_ONLY:
        for mode in ("forward",) if w in FORWARD_ONLY else ("forward", "gradient"):
            # A `_loops` forward row compares with the plain-loop Rust in the same order
            # (`native::plain`); gradient rows with the vectorised twin's hand-written gradient.
            native = (mode == "forward" and median_seconds(mode, f"{w}_native")) or \
                median_seconds(mode, f"{w.replace('_loops', '')}_native")
            cells = []
            for _, key in COLUMNS:
                if key is None:
                    cells.append("not built yet")
                    continue
                if mode == "gradient" and key.startswith("lua"):
                    cells.append("n/a (no AD)")
                    continue
                t = median_seconds(mode, f"{w}_{key}") if key != "native" else native
                if t is None:
                    cells.append("-")
                elif native and key != "native":
                    cells.append(f"{fmt(t)} ({t / native:.2f}×)")
                else:
                    cells.append(fmt(t))
            print(f"| {w} {mode} | " + " | ".join(cells) + " |")
    print("\nGradient overhead (gradient time / forward time, same tier, same run):\n")
    print("| workload | native Rust | zygvm interp |")
    print("| --- | --- | --- |")
    for w in WORKLOADS:
        base = w.replace("_loops", "")
        ratios = []
        for key, name in (("native", base), ("zygvm-interp", w)):
            f, g = median_seconds("forward", f"{name}_{key}"), median_seconds("gradient", f"{name}_{key}")
            ratios.append(f"{g / f:.2f}" if f and g else "-")
        print(f"| {w} | " + " | ".join(ratios) + " |")
    print("\nSecond order (forward over reverse), zygvm interp, against one gradient in the same run:\n")
    print("| workload | what | time | / one gradient |")
    print("| --- | --- | --- | --- |")
    for w, what in (("logsumexp", "full 100 x 100 Hessian (100 sweeps)"), ("mlp_loops", "one Hessian-vector product (weights)")):
        h, g = median_seconds("second_order", f"{w}_zygvm-interp"), median_seconds("gradient", f"{w}_zygvm-interp")
        if h and g:
            print(f"| {w} | {what} | {fmt(h)} | {h / g:.1f} |")
    print("\nThird order (tangent routines of tangent routines, towers), zygvm interp, against one gradient:\n")
    print("| workload | grad(grad(grad(f))) | / one gradient | derivative three times | / one gradient |")
    print("| --- | --- | --- | --- | --- |")
    for w in ("sincos", "loop"):
        g = median_seconds("gradient", f"{w}_zygvm-interp")
        r3, d3 = median_seconds("third_order", f"{w}_grad3-zygvm-interp"), median_seconds("third_order", f"{w}_derivative3-zygvm-interp")
        if g and r3 and d3:
            print(f"| {w} | {fmt(r3)} | {r3 / g:.0f} | {fmt(d3)} | {d3 / g:.0f} |")
    print()
    for w, iters in (("loop", 500), ("logreg_loops", 7840), ("mlp_loops", 128 * 784 + 10 * 128 + 10)):
        b = tape_bytes(w)
        if b is not None:
            print(f"Tape bytes per loop iteration, {w}: {b / iters:.2f} ({b} bytes at the peak, {iters} iterations).")
    # What one more iteration costs, apart from what every call records once.
    b500, b1000 = tape_bytes("loop"), tape_bytes("loop", ("let n = 500", "let n = 1000"))
    if b500 is not None and b1000 is not None:
        fixed = b500 - 500 * (b1000 - b500) / 500
        print(f"Tape bytes per iteration of loop's loop, marginal (1000 against 500 iterations): "
              f"{(b1000 - b500) / 500:.2f}, plus {fixed:.0f} bytes per call.")
    first = time_to_first_gradient()
    if first:
        print(f"Time to first gradient (fresh process, mlp_loops): {fmt(first[1])}; forward value only: {fmt(first[0])}.")
    compile_t = median_seconds("compile", "generated_20k_lines")
    never_t = median_seconds("compile", "generated_20k_lines_never_differentiated")
    every_t = median_seconds("compile", "generated_20k_lines_every_routine")
    first_t = median_seconds("compile", "generated_20k_lines_first_gradient")
    if compile_t and never_t and every_t:
        print(f"\nCompile time of a generated 20,000-line script: {fmt(compile_t)} (routines made on first use; "
              f"{compile_t / never_t:.2f}x the {fmt(never_t)} of a program never differentiated; "
              f"{fmt(every_t)} with every function's routines made at compile time).")
    if first_t:
        print(f"First gradient of one of its functions in a fresh VM (routines made, program copied): {fmt(first_t)}.")


ZYGVM = os.path.join(ROOT, "target", "release", "zygvm")
ZY = os.path.join(ROOT, "benches", "zy")


def tape_bytes(workload, replace=None):
    """Peak tape bytes of one gradient of the workload (`zygvm --stats`), its source changed by
    `replace` (old, new) if given."""
    src = open(os.path.join(ZY, f"{workload}.zy")).read() + "\nbench_grad()\n"
    if replace:
        assert replace[0] in src
        src = src.replace(*replace)
    r = subprocess.run([ZYGVM, "--stats", "-"], input=src, capture_output=True, text=True, cwd=ZY)
    for line in r.stderr.splitlines():
        if "peak tape bytes" in line:
            return int(line.split()[-1])
    return None


def time_to_first_gradient():
    """Median wall time of 5 fresh processes: (forward only, one gradient) of mlp_loops."""
    import time
    src = open(os.path.join(ZY, "mlp_loops.zy")).read()
    out = []
    for call in ("print(bench())", "print(bench_grad()[0])"):
        times = []
        for _ in range(5):
            t = time.perf_counter()
            subprocess.run([ZYGVM, "-"], input=src + "\n" + call + "\n", capture_output=True, text=True, cwd=ZY, check=True)
            times.append(time.perf_counter() - t)
        out.append(sorted(times)[2])
    return out


if __name__ == "__main__":
    main()
