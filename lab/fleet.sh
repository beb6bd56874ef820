#!/usr/bin/env bash
# The figures of docs/fleet.md's "Measured" and "Cost" sections: the fleet
# example with its own redis-server and with Redis unreachable, and the
# budget's benchmarks (medians of 8 runs). Writes lab/runs/fleet.json,
# lab/runs/fleet-unreachable.json and lab/runs/fleet-bench.json (about 1 min).
# The chaos figures come from fleet-chaos.sh, the load model's from fleet-load.sh.
set -euo pipefail
cd "$(dirname "$0")/../redisbudget"
go run ./examples/fleet -out ../lab/runs/fleet.json
REDIS_URL=redis://127.0.0.1:1 go run ./examples/fleet -outage 2s -out ../lab/runs/fleet-unreachable.json
cmd="go test -run ^\$ -bench . -benchmem -count 8 ."
$cmd | tee /dev/stderr | awk -v cmd="$cmd" '
	/^Benchmark/ {
		name = $1; sub(/-[0-9]+$/, "", name)
		if (!(name in n)) order[++k] = name
		i = ++n[name]; ns[name, i] = $3; allocs[name, i] = $7
	}
	function median(arr, name, c,    v, i, j, t) {
		for (i = 1; i <= c; i++) v[i] = arr[name, i] + 0
		for (i = 1; i <= c; i++) for (j = i + 1; j <= c; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
		return c % 2 ? v[(c + 1) / 2] : (v[c / 2] + v[c / 2 + 1]) / 2
	}
	END {
		printf "{\n  \"command\": \"%s\",\n  \"benchmarks\": [\n", cmd
		for (i = 1; i <= k; i++) {
			name = order[i]
			printf "    {\"name\": \"%s\", \"runs\": %d, \"median_ns_per_op\": %s, \"median_allocs_per_op\": %s}%s\n",
				name, n[name], median(ns, name, n[name]), median(allocs, name, n[name]), (i < k ? "," : "")
		}
		printf "  ]\n}\n"
	}' > ../lab/runs/fleet-bench.json
