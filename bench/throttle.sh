#!/usr/bin/env bash
# Runs docs/throttling.md's comparison: the fake-time run of
# TestThrottlingGoals (its table), then the real-time loopback run, saved as
# ../docs/throttling.json, its table, and the charts drawn from it into
# ../docs/img. About five minutes. Usage: (cd bench && ./throttle.sh)
set -euo pipefail
cd "$(dirname "$0")"
echo "## Fake time (go test -run 'TestThrottlingGoals|TestThrottleRecovery' -v .)"
go test -count=1 -run 'TestThrottlingGoals|TestThrottleRecovery' -v . | sed -n 's/^        //p' | grep '^|'
echo
echo "## Real time, loopback (go run ./cmd/throttle -json > ../docs/throttling.json)"
go run ./cmd/throttle -json > ../docs/throttling.json
go run ./cmd/throttle -in ../docs/throttling.json
(cd ../docs/plot && go run . -only throttle -throttle ../throttling.json -out ../img)
