#!/usr/bin/env bash
# The ablation of the RateLimiter's tuned numbers (docs/throttling.md,
# "Ablation"): the matrix run once with the defaults and once with each
# number at its neutral value (off, or the prior art's), retryhttp alone
# against the other peers' saved runs, built with the tag retryhttp_ablate
# (../ablate.go reads RETRYHTTP_ABLATE). Saves the goals summed up per
# setting as ../runs/throttling-ablation.json. About 2 minutes on 2 cores.
# Usage: (cd lab/bench && ./ablate.sh) [seeds, default 3]
set -euo pipefail
cd "$(dirname "$0")"
seeds=${1:-3}
settings=(
	"defaults="
	"limBeta at AWS's 0.7=beta=0.7"
	"limMargin off=margin=0"
	"limTau a quarter=tau=0.25"
	"limGrowth doubled=growth=0.1"
	"limGrowth halved=growth=0.025"
	"limWait the whole deadline=wait=1"
	"limCap off=cap=1e9"
	"limMinRate near 0=minrate=1e-6"
	"limHold off=hold=0"
)
out=../runs/throttling-ablation.json
echo "{\"seeds\": $seeds, \"settings\": [" > "$out.tmp"
first=1
for s in "${settings[@]}"; do
	label=${s%%=*}
	env=${s#*=}
	[ $first = 1 ] || echo "," >> "$out.tmp"
	first=0
	RETRYHTTP_ABLATE="$env" go run -tags retryhttp_ablate ./cmd/matrix -peers '^retryhttp$' -seeds "$seeds" \
		-against ../runs/throttling-matrix.json -json -summaries -label "$label" >> "$out.tmp" 2> /dev/null
done
echo "]}" >> "$out.tmp"
mv "$out.tmp" "$out"
