module github.com/herdproof/retryhttp/lab/stress

go 1.25

require (
	github.com/herdproof/retryhttp v0.1.0
	go.uber.org/goleak v1.3.0
)

require (
	github.com/google/uuid v1.6.0 // indirect
	github.com/hashicorp/go-cleanhttp v0.5.2 // indirect
)

// Development against this checkout; ignored by the module's users, who get
// the required version (see docs/releasing.md).
replace github.com/herdproof/retryhttp => ../../
