#!/usr/bin/env bash
# Added CPU cost of the preload library per driver call, on a real GPU.
# Builds libvgpu.so and driver_overhead, then runs rounds alternating
# "no preload" and "preload with a memory limit" (no SM limit), and prints the
# medians and their differences as JSON. Usage: bench/run_overhead.sh [rounds] [launches]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-7}
launches=${2:-200000}
make -s -C native all >/dev/null
mkdir -p native/build/bench
cc -O2 -Wall -Inative/include -o native/build/bench/driver_overhead bench/driver_overhead.c -ldl
slice_dir=$(mktemp -d)
trap 'rm -rf "$slice_dir"' EXIT
for i in $(seq "$rounds"); do
	native/build/bench/driver_overhead "$launches" | sed 's/^/{"mode": "baseline", "row": /; s/$/}/'
	HAMI_SLICE="$slice_dir/bench.slice" CUDA_DEVICE_MEMORY_LIMIT=8g LD_PRELOAD="$PWD/native/build/libvgpu.so" \
		native/build/bench/driver_overhead "$launches" | sed 's/^/{"mode": "preload", "row": /; s/$/}/'
done | python3 -c '
import json, statistics, sys
rows = [json.loads(l) for l in sys.stdin]
out = {}
for mode in ("baseline", "preload"):
    rs = [r["row"] for r in rows if r["mode"] == mode]
    out[mode] = {k: statistics.median(r[k] for r in rs) for k in ("launch_ns", "alloc_free_ns", "meminfo_ns")}
    out[mode]["total_bytes"] = rs[-1]["total_bytes"]
out["added_ns"] = {k: round(out["preload"][k] - out["baseline"][k], 1) for k in ("launch_ns", "alloc_free_ns", "meminfo_ns")}
out["rounds"] = len(rows) // 2
print(json.dumps(out, indent=1))
'
