#!/usr/bin/env bash
# The load model of docs/fleet.md: Redis commands during an outage at 10, 50
# and 200 processes and two request rates, each process a Budget with its own
# go-redis client in one test binary, against a redis-server of the test's
# own; and this machine's Redis throughput for the budget's script
# (redis-benchmark). Writes lab/runs/fleet-load.json (about 90 s).
set -euo pipefail
cd "$(dirname "$0")/../redisbudget"
go test -count=1 -run '^TestLoadModel$' -timeout 10m -v -load.json ../lab/runs/fleet-load.json . | grep -v '^=== RUN'
