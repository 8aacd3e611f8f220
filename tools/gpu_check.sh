#!/bin/sh
# gpu_check.sh - on a GPU host: build ferry with CUDA, run the CUDA op tests
# (tests/test_cuda against the CPU backend) and a CUDA-vs-CPU generation
# timing, and print a short table last.
#
# NEVER RUN YET: written without a GPU (issue 9 ended blocked); the first
# run on a GPU host is the first time any of the CUDA kernels execute.
#
# A GPU host has no package registry: bring ferry's Debian libraries along
# as /work/shared/device/README.md says (.debs/, git-ignored), then
#     . .debs/use-debs.sh .debs && sh tools/gpu_check.sh
# Building needs nvcc on PATH or at /usr/local/cuda/bin/nvcc.
set -u
model=${FERRY_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
prompt="Explain paged attention in two sentences."
out=$(mktemp -d)

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/gpu: /'
make -j"$(nproc)" CUDA=1 >"$out/build.log" 2>&1
build=$?
[ $build -eq 0 ] || tail -40 "$out/build.log"

cuda_tests="not run"
if [ $build -eq 0 ]; then
    build/release/tests/test_cuda >"$out/test_cuda.log" 2>&1
    rc=$?
    cat "$out/test_cuda.log"
    p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$out/test_cuda.log" | tail -n 1)
    s=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$out/test_cuda.log" | tail -n 1)
    cuda_tests="rc $rc, ${p:-0} passed, ${s:-0} skipped"
fi

gen() { # device -> "tok/s" line from ferry generate -v
    if [ ! -f "$model" ]; then echo "no model at $model"; return; fi
    bin/ferry generate -m "$model" -p "$prompt" -n 128 --ignore-eos --device "$1" -v >"$out/gen_$1.txt" 2>&1 ||
        { echo "failed (see below)"; tail -5 "$out/gen_$1.txt" >&2; return; }
    grep -Ei 'tok/s|tokens/s' "$out/gen_$1.txt" | tail -n 1
}
gen_cpu="not run"
gen_cuda="not run"
if [ $build -eq 0 ]; then
    gen_cpu=$(gen cpu)
    gen_cuda=$(gen cuda)
    grep -i "falling back" "$out/gen_cuda.txt" && gen_cuda="FELL BACK TO CPU: $gen_cuda"
fi

echo
echo "| check | result |"
echo "|---|---|"
echo "| build (CUDA=1, sm_80 + sm_90) | $([ $build -eq 0 ] && echo ok || echo FAILED) |"
echo "| test_cuda (ops vs CPU) | $cuda_tests |"
echo "| generate 128 tokens, cpu | $gen_cpu |"
echo "| generate 128 tokens, cuda | $gen_cuda |"
rm -rf "$out"
