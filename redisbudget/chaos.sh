#!/usr/bin/env bash
# TestChaos, long: three seeded runs of 60 s, 20 processes (hedges
# included), while the test pauses, resumes, kills and restarts its
# redis-server at random. Writes docs/fleet-chaos.json (about 3 min). CI
# runs the short version (one seed, 3 s, 6 processes) under -race.
set -euo pipefail
cd "$(dirname "$0")"
go test -count=1 -run '^TestChaos$' -timeout 30m -v \
	-chaos.seeds 1,2,3 -chaos.duration 60s -chaos.processes 20 -chaos.json ../docs/fleet-chaos.json . | grep -v '^=== RUN'
