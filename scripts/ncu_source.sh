#!/bin/bash
# Per-instruction (SASS) stall samples of the partition kernel for one shape, with Nsight Compute.
# Usage: scripts/ncu_source.sh OUTDIR B H L [dtype] [backend] [kv]
# Writes OUTDIR/ncu_B_H_L[_backend][_kv].csv (source page: one row per SASS instruction with
# its samples) and the .txt beside it (the summary sections); backend and kv name the file
# when given, so that runs of one shape do not overwrite each other.
set -e
out=$1; shift
name=ncu_$1_$2_$3${5:+_$5}${6:+_$6}
NCU=${NCU:-/usr/local/cuda/bin/ncu}
$NCU --clock-control none --kernel-name regex:partition --launch-skip 1 --launch-count 1 \
    --section SourceCounters --section WarpStateStats --section SpeedOfLight --section Occupancy \
    --section ComputeWorkloadAnalysis --section InstructionStats \
    --import-source no -f -o "$out/$name" python scripts/profile_one.py "$@" > /dev/null
$NCU -i "$out/$name.ncu-rep" --page details > "$out/$name.txt"
$NCU -i "$out/$name.ncu-rep" --page source --csv --print-source sass > "$out/$name.csv"
rm -f "$out/$name.ncu-rep"
