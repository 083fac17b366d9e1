#!/bin/sh
# Every benchmark workload's result, printed in full, from the x86-64 and the AArch64 builds
# (the latter under qemu-user) with the JIT on every function (`--jit eager`) and on hot ones
# (`auto`): the two architectures must print the same bits. Runs each `bench*` function of
# each `benches/zy/*.zy` once. Exits non-zero on the first difference.
#
# Usage: benches/cross-arch.sh X86_ZYGVM ARM_ZYGVM   (ARM_ZYGVM: an executable, such as a
# wrapper that runs the aarch64 binary under qemu)
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
abs() { case $1 in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
x86=$(abs "$1")
arm=$(abs "$2")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0
for w in "$root"/benches/zy/*.zy; do
    name=$(basename "$w" .zy)
    for fn in $(sed -n 's/^fn \(bench[a-z_]*\)().*/\1/p' "$w"); do
        { cat "$w"; printf 'print(%s())\n' "$fn"; } > "$tmp/$name-$fn.zy"
        for mode in eager auto; do
            (cd "$root/benches/zy" && "$x86" --jit $mode "$tmp/$name-$fn.zy") > "$tmp/x86" 2>&1 || true
            (cd "$root/benches/zy" && "$arm" --jit $mode "$tmp/$name-$fn.zy") > "$tmp/arm" 2>&1 || true
            if cmp -s "$tmp/x86" "$tmp/arm"; then
                echo "$name $fn --jit $mode: identical ($(wc -c < "$tmp/x86") bytes)"
            else
                echo "$name $fn --jit $mode: DIFFERENT"
                diff "$tmp/x86" "$tmp/arm" | cut -c1-200 | head -5
                status=1
            fi
        done
    done
done
exit $status
