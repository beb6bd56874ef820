#!/usr/bin/env bash
# Makes the saved runs that the docs quote (lab/runs/*.json, *.txt), each
# with the command that measures it. The figures in the prose are checked
# against these files by lab/check (see lab/check/doc.go): after a run,
# `cd lab/check && go test .` lists every figure that changed.
#
#   lab/runs.sh             # all of them (about twenty minutes on 2 cores)
#   lab/runs.sh herd-model  # one (the names below)
#
# docs/benchmarks.md and lab/runs/throttling.json are made by
# lab/bench/run.sh and lab/bench/throttle.sh; the matrices by
# lab/bench/matrix.sh, the ablation by lab/bench/ablate.sh, the fleet's
# runs by lab/fleet.sh, lab/fleet-chaos.sh and lab/fleet-load.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

run() { # name, then the command; its output is lab/runs/<name>
	local name=$1
	shift
	if [ -n "$only" ] && [ "$only" != "${name%.*}" ]; then return; fi
	echo "lab/runs/$name: $*" >&2
	"$@" > "lab/runs/$name.tmp"
	mv "lab/runs/$name.tmp" "lab/runs/$name"
}
only=${1:-}

# The herd (docs/herd.md, docs/budget.md). The model, the layers and the
# budget runs are deterministic; the real herd is a loopback run.
run herd-model.json go run ./examples/herd -model -seeds 200 -json
run herd-layers.json go run ./examples/herd -layers -json -requests 3000
run budget.json go run ./examples/herd -budget -json
run herd-real.json go run ./examples/herd -json
# The same on a loaded machine (six busy loops of its own on the two
# cores), where the runs stray from the model and the demo's sentences
# must still follow its table.
busy() {
	local pids=()
	for _ in 1 2 3 4 5 6; do
		sh -c 'while :; do :; done' &
		pids+=($!)
	done
	"$@" || true
	kill "${pids[@]}"
}
run herd-real-busy.json busy go run ./examples/herd -json

# One client, many hosts (docs/guide-many-hosts.md), over loopback.
run webhooks.json go run ./examples/webhooks -json

# Deadlines across services and measured attempt timeouts
# (docs/guide-http-client.md, docs/design.md §16), over loopback; about a
# minute. Saved in docs/, beside the guide, as issue 35 asks. Its charts:
# (cd lab/plot && go run . -only deadlines -deadlines ../../docs/deadlines.json)
if [ -z "$only" ] || [ "$only" = deadlines ]; then
	echo "docs/deadlines.json: go run ./examples/deadlines -json" >&2
	go run ./examples/deadlines -json > docs/deadlines.json.tmp
	mv docs/deadlines.json.tmp docs/deadlines.json
fi

# Hedging (docs/guide-hedging.md), over loopback.
run hedging.json sh -c 'cd lab/bench && go run ./cmd/hedge -json'
# ...and on workloads the hedging matrix does not use (docs/hedging-heldout.md;
# about eight minutes).
run hedging-heldout.json sh -c 'cd lab/bench && go run ./cmd/hedgecheck -workload all -seeds 3 -json'

# Throttling (docs/throttling.md): the held-out workloads, every peer, 3
# seeds (the matrix is lab/bench/matrix.sh, the ablation lab/bench/ablate.sh).
run throttling-heldout.json sh -c 'cd lab/bench && go run ./cmd/matrix -heldout -seeds 3 -json'

# A fleet sharing one budget (docs/fleet.md), with a redis-server of its
# own, and with Redis unreachable.
run fleet.json sh -c 'cd redisbudget && go run ./examples/fleet -json'
run fleet-no-redis.json sh -c 'cd redisbudget && REDIS_URL=redis://127.0.0.1:1 go run ./examples/fleet -json -outage 2s'
run fleet-bench.txt sh -c "cd redisbudget && go test -run '^\$' -bench . -benchmem -count=6 ."

# The root module's benchmarks that the docs quote: the success path with
# an idle RateLimiter, the idempotency key, the Handler middleware.
run bench-root.txt go test -run '^$' -bench 'RoundTripSuccess|IdempotencyKey|Handler' -benchmem -count=6 .
