#!/bin/sh
# Instructions executed in JIT-generated code, per call of a benchmark workload, on x86-64 and
# AArch64 alike: both statically linked zygvm binaries run under QEMU's user-mode emulator
# with the counting plugin `jitcount.c` (instructions outside every symbol of the binary).
# Each workload runs its `bench` (forward) and `bench_grad` (gradient) N and 2N times in one
# process under `--jit auto`; the difference, divided by N, is the steady state per call
# (warm-up and compilation cancel out). It also prints both architectures' results, which
# must agree to the bit.
#
# Usage: benches/insns/count.sh [WORKLOAD...]   (default: loop mlp_loops; needs qemu-user,
# gcc, gcc-aarch64-linux-gnu, libc6-dev-arm64-cross and the aarch64 Rust target: `.ci/aarch64`
# installs them)
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
out=$root/target/insns
mkdir -p "$out"
gcc -shared -fPIC -O2 -o "$out/jitcount.so" "$root/benches/insns/jitcount.c"
for t in x86_64 aarch64; do
    RUSTFLAGS="-C target-feature=+crt-static" cargo build -q --release --bin zygvm \
        --target $t-unknown-linux-gnu --target-dir "$out/build" --manifest-path "$root/Cargo.toml"
done
workloads=${*:-loop mlp_loops}
n=${N:-200}
for w in $workloads; do
    for fn in bench bench_grad; do
        for t in x86_64 aarch64; do
            counts=""
            for k in $n $((2 * n)); do
                s=$out/$w-$fn-$k.zy
                { cat "$root/benches/zy/$w.zy"; printf 'let r = nil\nfor _ in 0..%d { r = %s() }\nprint(r)\n' $k $fn; } > "$s"
                line=$(qemu-$t -plugin "$out/jitcount.so" -d plugin -D "$out/log" \
                    "$out/build/$t-unknown-linux-gnu/release/zygvm" "$s" > "$out/result-$t" && cat "$out/log")
                counts="$counts $(echo "$line" | sed -n 's/^insns: anonymous \([0-9]*\) .*/\1/p')"
            done
            set -- $counts
            echo "$w $fn $t: $(( ($2 - $1) / n )) JIT instructions per call; result $(cut -c1-60 "$out/result-$t")"
        done
        cmp -s "$out/result-x86_64" "$out/result-aarch64" && echo "$w $fn: results identical" \
            || echo "$w $fn: RESULTS DIFFER"
    done
done
