#!/usr/bin/env bash
# Runs retryhttp's RateLimiter over the throttling matrix with Recovery at
# 5, 10 and 40 s (the default is 20 s), against the other peers' runs
# saved in ../docs/throttling-matrix.json, and saves each setting's goals,
# summed up, as ../docs/throttling-recovery-<setting>.json (docs/throttling.md,
# "Choosing Recovery"). About 30 seconds a setting on a 2-core machine.
# Usage: (cd bench && ./recovery.sh)
set -euo pipefail
cd "$(dirname "$0")"
for r in 5s 10s 40s; do
	go run ./cmd/matrix -json -summaries -peers '^retryhttp-variant$' -recovery "$r" \
		-against ../docs/throttling-matrix.json > "../docs/throttling-recovery-$r.json"
done
