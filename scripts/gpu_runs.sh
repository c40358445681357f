#!/bin/bash
# The measurements a GPU session refreshes, as named steps, so that they do not depend on a
# session's own notes. Usage: scripts/gpu_runs.sh OUTDIR STEP [STEP...]
#
#   sweeps  the default, varlen and fp8 sweeps of `numba-mla bench` (numba_mla's "mma" beside
#           FlashMLA and torch's bmm where importable) -> OUTDIR/{bench,varlen,fp8}_<dev>_<commit>.json
#   ab8     an A/B of the seesaw kernel's qk8 forms on "e4m3" rows at 128 heads (the default
#           against S8_PAIRS, CODES_WIDE, STAGE8 and all three; scripts/ab.py, two rounds)
#           -> OUTDIR/ab_e4m3_qk8_<commit>.json, then those forms' GPU tests
#   suite   the test suite's tensor-core selection (scripts/gpu_suite.py: the kernel, split,
#           FP8, schedule, plan and wgmma primitive tests without the other backends' cases)
#           -> OUTDIR/suite.txt; SUITE_SECONDS (default 330) bounds it
#   sanitize  compute-sanitizer over the "mma" cases (scripts/sanitize.py) -> OUTDIR/sanitize.txt
#
# Environment: COMMIT labels the files and the JSON (default: the checkout's short hash; on a
# machine whose copy of the repository is older than its files, give it); DEV names the device
# in file names (default h200); PEERS, a folder put on PYTHONPATH first (where a FlashMLA
# build's `flash_mla` package is); SET, seesaw flags for the suite and sanitize steps, e.g.
# SET="STAGE8=True S8_PAIRS=True" (each line `NAME = ...` of numba_mla/kernels/seesaw.py
# replaced in this checkout: run it in a copy). Every step's time is bounded (timeout), so a
# step cut short leaves what it wrote.
set -u
out=$1; shift
mkdir -p "$out"
export PYTHONUNBUFFERED=1
[ -n "${PEERS:-}" ] && export PYTHONPATH="$PEERS${PYTHONPATH:+:$PYTHONPATH}"
commit=${COMMIT:-$(git rev-parse --short HEAD)}
dev=${DEV:-h200}
bench="python3 -m numba_mla.cli bench --commit $commit --no-progress"
set_flags() {
    for kv in ${SET:-}; do
        sed -i "s/^${kv%%=*} = .*/${kv%%=*} = ${kv#*=}/" numba_mla/kernels/seesaw.py
    done
    grep -n "^S8_PAIRS\|^CODES_WIDE\|^STAGE8" numba_mla/kernels/seesaw.py
}
for step in "$@"; do
    echo "== $step ($(date -u +%H:%M:%S))"
    case $step in
    sweeps)
        peers=numba_mla:mma,torch_bmm
        python3 -c "import flash_mla" 2>/dev/null && peers=$peers,flash_mla
        timeout 150 $bench --sweep default --providers $peers --out "$out/bench_${dev}_$commit.json" 2>&1 | tail -25
        timeout 240 $bench --sweep varlen --providers ${peers/,torch_bmm/} --out "$out/varlen_${dev}_$commit.json" 2>&1 | tail -25
        timeout 180 $bench --sweep fp8 --providers ${peers/,torch_bmm/} --out "$out/fp8_${dev}_$commit.json" 2>&1 | tail -20
        ;;
    ab8)
        s=kernels.seesaw
        timeout 380 python3 scripts/ab.py WORKTREE WORKTREE+$s.S8_PAIRS=True \
            WORKTREE+$s.CODES_WIDE=True WORKTREE+$s.STAGE8=True \
            WORKTREE+$s.S8_PAIRS=True+$s.CODES_WIDE=True+$s.STAGE8=True \
            --worktree-label "$commit" --out "$out/ab_e4m3_qk8_$commit.json" -- --sweep fp8 \
            --shapes 64x128x4096,128x128x1024 --providers numba_mla:mma --no-progress 2>&1 | tail -30
        timeout 120 python3 -m pytest -q -p no:cacheprovider -m "gpu or not gpu" -n 8 \
            tests/test_fp8.py -k qk8_forms 2>&1 | tail -8
        ;;
    suite)
        set_flags
        python3 scripts/gpu_suite.py --log "$out/suite.txt" --seconds "${SUITE_SECONDS:-330}" \
            -k "not mma_sync and not simt and not simple and not warpsplit and not reference" \
            tests/test_kernels.py tests/test_split_paths.py tests/test_fp8.py tests/test_schedule.py \
            tests/test_plans.py tests/test_ptx_wgmma.py tests/test_ptx_conversions.py
        echo "suite: exit $? (0 all passed or skipped, 1 a failure, 3 some not reached)"
        ;;
    sanitize)
        set_flags
        timeout "${SANITIZE_SECONDS:-240}" python3 scripts/sanitize.py --backend mma \
            --out "$out/sanitize.txt" 2>&1 | tail -30
        ;;
    *)
        echo "unknown step $step: sweeps, ab8, suite or sanitize" >&2
        exit 2
        ;;
    esac
done
