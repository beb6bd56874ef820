#!/usr/bin/env bash
# Runs docs/throttling.md's single-workload comparison: in fake time, saved
# as ../runs/throttling-fake.json (TestThrottlingGoals runs this library's
# limiter against its other runs), then in real time over loopback, saved as
# ../runs/throttling.json, their tables, and the charts drawn from the
# loopback run into ../../docs/img. About two minutes.
# Usage: (cd lab/bench && ./throttle.sh)
set -euo pipefail
cd "$(dirname "$0")"
echo "## Fake time (go run ./cmd/throttle -fake -json > ../runs/throttling-fake.json)"
go run ./cmd/throttle -fake -json > ../runs/throttling-fake.json
go run ./cmd/throttle -in ../runs/throttling-fake.json
echo
echo "## Real time, loopback (go run ./cmd/throttle -json > ../runs/throttling.json)"
go run ./cmd/throttle -json > ../runs/throttling.json
go run ./cmd/throttle -in ../runs/throttling.json
(cd ../plot && go run . -only throttle -throttle ../runs/throttling.json -out ../../docs/img)
