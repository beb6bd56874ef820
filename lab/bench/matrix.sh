#!/usr/bin/env bash
# Runs issue 18's matrices and saves them for the docs: the throttling
# matrix in fake time (../runs/throttling-matrix.json, its charts in
# ../../docs/img; about 7 minutes on a 2-core machine with 15 seeds, most of
# it the AWS SDK's waiters; 15 rather than 5, so that the goals met, which
# compare medians, move less with the AWS SDK's draw; bench's
# TestThrottleMatrixGoals asserts its goals) and the hedging matrix over
# loopback in real time
# (../runs/hedging-matrix.json; 6 minutes with 5 seeds; keep the machine
# otherwise idle), then prints both reports' tables.
# Usage: (cd lab/bench && ./matrix.sh) [throttling seeds, default 15] [hedging seeds, default 5]
set -euo pipefail
cd "$(dirname "$0")"
tseeds=${1:-15} # bench.MatrixSeeds
hseeds=${2:-5}
go run ./cmd/matrix -json -seeds "$tseeds" > ../runs/throttling-matrix.json
go run ./cmd/hedgematrix -json -seeds "$hseeds" > ../runs/hedging-matrix.json
go run ./cmd/matrix -in ../runs/throttling-matrix.json
(cd ../plot && go run . -only matrix -matrix ../runs/throttling-matrix.json -out ../../docs/img)
echo
go run ./cmd/hedgematrix -in ../runs/hedging-matrix.json
