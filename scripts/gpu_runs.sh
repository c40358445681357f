#!/bin/bash
# The measurements a GPU session refreshes, as named steps, so that they do not depend on a
# session's own notes. Usage: scripts/gpu_runs.sh OUTDIR STEP [STEP...]
#
#   sweeps  the default, varlen and fp8 sweeps of `numba-mla bench` (numba_mla's "mma" beside
#           FlashMLA and torch's bmm where importable) -> OUTDIR/{bench,varlen,fp8}_<dev>_<commit>.json
#   ab8     an A/B of the seesaw kernel's qk8 forms on "e4m3" rows at 128 heads (the default
#           against S8_PAIRS, CODES_WIDE, STAGE8 and all three; scripts/ab.py, two rounds of
#           the fp8 sweep's rows at 64x128x4096 and 128x128x1024: bf16, e4m3 and v32)
#           -> OUTDIR/ab_e4m3_qk8_<commit>.json, then those forms' GPU tests
#   suite   the test suite's tensor-core selection (scripts/gpu_suite.py: the kernel, split,
#           FP8, schedule, plan and wgmma primitive tests without the other backends' cases)
#           -> OUTDIR/suite_N.txt, each call passing the earlier ones (--done) so that a
#           selection cut short goes on where it stopped; SUITE_SECONDS (default 330) bounds it
#   sanitize  compute-sanitizer over the "mma" cases (scripts/sanitize.py) -> OUTDIR/sanitize.txt
#           (each tool's output appended to OUTDIR/sanitize_log.txt as it ends)
#
# Environment: COMMIT labels the files and the JSON (default: the checkout's short hash; on a
# machine whose copy of the repository is older than its files, give it); DEV names the device
# in file names (default: h200 or h100 from nvidia-smi's name, else gpu); PEERS, a folder put
# on PYTHONPATH after the checkout (where a FlashMLA build's `flash_mla` package is); SET, seesaw flags for
# the suite and sanitize steps, e.g. SET="STAGE8=True S8_PAIRS=True" (each line `NAME = ...`
# of numba_mla/kernels/seesaw.py replaced for the step, and the file put back after it; a
# name without such a line stops the script). Every step's time is bounded (timeout), so a
# step cut short leaves what it wrote; the exit status is the last failing step's.
set -u -o pipefail
if [ $# -lt 2 ]; then
    echo "usage: scripts/gpu_runs.sh OUTDIR STEP [STEP...] (sweeps, ab8, suite, sanitize)" >&2
    exit 2
fi
out=$1; shift
mkdir -p "$out"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PEERS:+:$PEERS}${PYTHONPATH:+:$PYTHONPATH}"  # (numba_mla from here)
commit=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
case $gpu in *H200*) dev=${DEV:-h200} ;; *H100*) dev=${DEV:-h100} ;; *) dev=${DEV:-gpu} ;; esac
bench="python3 -m numba_mla.cli bench --commit $commit --no-progress"
seesaw=numba_mla/kernels/seesaw.py
status=0
set_flags() {  # (SET's flags into seesaw.py; the original kept beside it until put back)
    cp "$seesaw" "$out/.seesaw.py.orig"
    for kv in ${SET:-}; do
        if ! grep -q "^${kv%%=*} = " "$seesaw" || [ "${kv#*=}" = "$kv" ]; then
            echo "SET: no line '${kv%%=*} = ...' in $seesaw, or no =VALUE: $kv" >&2
            put_back
            exit 2
        fi
        sed -i "s/^${kv%%=*} = .*/${kv%%=*} = ${kv#*=}/" "$seesaw"
    done
    grep -n "^S8_PAIRS\|^CODES_WIDE\|^STAGE8" "$seesaw"
}
put_back() { mv "$out/.seesaw.py.orig" "$seesaw"; }
check() { local rc=$?; [ $rc -ne 0 ] && { echo "($1: exit $rc)"; status=$rc; }; return 0; }
for step in "$@"; do
    echo "== $step ($(date -u +%H:%M:%S))"
    case $step in
    sweeps)
        peers=numba_mla:mma,torch_bmm
        python3 -c "import flash_mla" 2>/dev/null && peers=$peers,flash_mla
        timeout 150 $bench --sweep default --providers $peers --out "$out/bench_${dev}_$commit.json" 2>&1 | tail -25
        check default
        timeout 240 $bench --sweep varlen --providers ${peers/,torch_bmm/} --out "$out/varlen_${dev}_$commit.json" 2>&1 | tail -25
        check varlen
        timeout 180 $bench --sweep fp8 --providers ${peers/,torch_bmm/} --out "$out/fp8_${dev}_$commit.json" 2>&1 | tail -20
        check fp8
        ;;
    ab8)
        s=kernels.seesaw
        timeout 380 python3 scripts/ab.py WORKTREE WORKTREE+$s.S8_PAIRS=True \
            WORKTREE+$s.CODES_WIDE=True WORKTREE+$s.STAGE8=True \
            WORKTREE+$s.S8_PAIRS=True+$s.CODES_WIDE=True+$s.STAGE8=True \
            --worktree-label "$commit" --out "$out/ab_e4m3_qk8_$commit.json" -- --sweep fp8 \
            --shapes 64x128x4096,128x128x1024 --providers numba_mla:mma --no-progress 2>&1 | tail -30
        check ab
        timeout 120 python3 -m pytest -q -p no:cacheprovider -m "gpu or not gpu" -n 8 \
            tests/test_fp8.py -k qk8_forms 2>&1 | tail -8
        check qk8_forms
        ;;
    suite)
        set_flags
        done_logs=$(ls "$out"/suite_*.txt 2>/dev/null)
        n=$(( $(echo "$done_logs" | grep -c suite_) + 1 ))
        python3 scripts/gpu_suite.py --log "$out/suite_$n.txt" ${done_logs:+--done $done_logs} \
            --seconds "${SUITE_SECONDS:-330}" \
            -k "not mma_sync and not simt and not simple and not warpsplit and not reference" \
            tests/test_kernels.py tests/test_split_paths.py tests/test_fp8.py tests/test_schedule.py \
            tests/test_plans.py tests/test_ptx_wgmma.py tests/test_ptx_conversions.py
        check "suite (0 all passed or skipped, 1 a failure, 3 some not reached)"
        put_back
        ;;
    sanitize)
        set_flags
        timeout "${SANITIZE_SECONDS:-540}" python3 scripts/sanitize.py --backend mma \
            --out "$out/sanitize.txt" --log "$out/sanitize_log.txt" 2>&1 | tail -30
        check sanitize
        put_back
        ;;
    *)
        echo "unknown step $step: sweeps, ab8, suite or sanitize" >&2
        exit 2
        ;;
    esac
done
exit $status
