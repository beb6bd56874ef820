#!/usr/bin/env bash
# TestChaos, long: three seeds, each 30 s on one Redis and 30 s on a
# 3-master Redis Cluster with a replica each, 20 processes (hedges included)
# with go-redis at its default settings, while the test pauses and resumes,
# kills -9 and restarts the node serving the bucket, drops its connections
# between scripts and their replies (CLIENT KILL), and fails the Cluster
# over to the replica. Writes lab/runs/fleet-chaos.json and prints the table of
# docs/fleet.md (about 5 min). CI runs the short version (one seed, 3 s a
# Redis, 6 processes) under -race.
set -euo pipefail
cd "$(dirname "$0")/../redisbudget"
go test -count=1 -run '^TestChaos$' -timeout 30m -v \
	-chaos.seeds 1,2,3 -chaos.duration 30s -chaos.processes 20 -chaos.json ../lab/runs/fleet-chaos.json . | grep -v '^=== RUN'
