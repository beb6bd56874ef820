#!/usr/bin/env bash
# The ablation of the RateLimiter's tuned numbers (docs/throttling.md,
# "Ablation"): the matrix run once with the defaults and once with each
# number at its neutral value (off, or the prior art's), retryhttp alone
# against the other peers' saved runs, built with the tag retryhttp_ablate
# (../ablate.go reads RETRYHTTP_ABLATE), and each held-out set as well (3
# seeds, against ../runs/throttling-heldout.json and -heldout2.json). Saves
# the goals summed up per setting as ../runs/throttling-ablation.json (the
# matrix's in summaries, the held-out sets' in heldout and heldout2). About
# 2 minutes on 2 cores. Needs jq. A goal met nowhere reads 0 (the report
# leaves it out).
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
	run() {
		RETRYHTTP_ABLATE="$env" go run -tags retryhttp_ablate ./cmd/matrix -peers '^retryhttp$' -json -summaries \
			-label "$label" "$@" 2> /dev/null
	}
	run -seeds "$seeds" -against ../runs/throttling-matrix.json > "$out.m"
	run -heldout -seeds 3 -against ../runs/throttling-heldout.json > "$out.h1"
	run -heldout2 -seeds 3 -against ../runs/throttling-heldout2.json > "$out.h2"
	jq --slurpfile h1 "$out.h1" --slurpfile h2 "$out.h2" \
		'def zero: map(.met = ({goodput: 0, "429s": 0, recovery: 0, fairness: 0, wait: 0} + .met));
		. + {summaries: (.summaries | zero), heldout: ($h1[0].summaries | zero), heldout2: ($h2[0].summaries | zero)}' \
		"$out.m" >> "$out.tmp"
done
rm -f "$out.m" "$out.h1" "$out.h2"
echo "]}" >> "$out.tmp"
mv "$out.tmp" "$out"
