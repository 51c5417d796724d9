#!/usr/bin/env bash
# PyTorch training-step slowdown under the preload library (memory limit set,
# no SM limit): alternates runs without and with LD_PRELOAD and prints the
# median step times and the slowdown in percent. Usage: bench/run_torch_step.sh [rounds]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
make -s -C native all >/dev/null
slice_dir=$(mktemp -d)
trap 'rm -rf "$slice_dir"' EXIT
for i in $(seq "$rounds"); do
	python3 bench/torch_step.py | sed 's/^/{"mode": "baseline", "row": /; s/$/}/'
	HAMI_SLICE="$slice_dir/bench.slice" CUDA_DEVICE_MEMORY_LIMIT=16g LD_PRELOAD="$PWD/native/build/libvgpu.so" \
		python3 bench/torch_step.py | sed 's/^/{"mode": "preload", "row": /; s/$/}/'
done | python3 -c '
import json, statistics, sys
rows = [json.loads(l) for l in sys.stdin]
b = statistics.median(r["row"]["step_ms"] for r in rows if r["mode"] == "baseline")
p = statistics.median(r["row"]["step_ms"] for r in rows if r["mode"] == "preload")
total = [r["row"]["mem_total"] for r in rows if r["mode"] == "preload"][-1]
print(json.dumps({"baseline_step_ms": round(b, 4), "preload_step_ms": round(p, 4),
                  "slowdown_percent": round((p - b) / b * 100, 2), "preload_mem_total": total,
                  "rounds": len(rows) // 2}))
'
