#!/usr/bin/env bash
# Runs docs/throttling.md's single-workload comparison: in fake time, saved
# as ../docs/throttling-fake.json (TestThrottlingGoals runs this library's
# limiter against its other runs), then in real time over loopback, saved as
# ../docs/throttling.json, their tables, and the charts drawn from the
# loopback run into ../docs/img. About two minutes.
# Usage: (cd bench && ./throttle.sh)
set -euo pipefail
cd "$(dirname "$0")"
echo "## Fake time (go run ./cmd/throttle -fake -json > ../docs/throttling-fake.json)"
go run ./cmd/throttle -fake -json > ../docs/throttling-fake.json
go run ./cmd/throttle -in ../docs/throttling-fake.json
echo
echo "## Real time, loopback (go run ./cmd/throttle -json > ../docs/throttling.json)"
go run ./cmd/throttle -json > ../docs/throttling.json
go run ./cmd/throttle -in ../docs/throttling.json
(cd ../docs/plot && go run . -only throttle -throttle ../throttling.json -out ../img)
