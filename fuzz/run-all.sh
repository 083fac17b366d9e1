#!/usr/bin/env bash
# Runs every fuzz target for SECONDS each (default 60), one after another, from the seed corpus
# (the project's .zy tests) plus what earlier runs kept in corpus/. Fails on the first crash;
# the input is saved under artifacts/TARGET/. Usage: fuzz/run-all.sh [SECONDS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")"
secs=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(compile_bytes run_limited gradients embed_api jit_differential)
for t in compile_bytes run_limited; do
    mkdir -p "corpus/$t"
    find ../tests/zy ../examples ../benches/zy -name '*.zy' -exec cp {} "corpus/$t/" \;
done
cargo +nightly fuzz build -O
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t"
    echo "== fuzz $t for ${secs}s"
    rm -rf "artifacts/$t"
    cargo +nightly fuzz run -O "$t" -- -max_total_time="$secs" -max_len=4096 -timeout=30 \
        -rss_limit_mb=3000 -malloc_limit_mb=1024 -print_final_stats=1 2>&1 \
        | grep -E '^(stat::number_of_executed_units|stat::peak_rss_mb|==[0-9]+==|SUMMARY|thread .* panicked)|Done [0-9]+ runs' || true
    if compgen -G "artifacts/$t/*" >/dev/null; then echo "fuzz $t found a crash: $(ls artifacts/$t)"; exit 1; fi
done
