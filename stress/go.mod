module github.com/herdproof/retryhttp/stress

go 1.25

require (
	github.com/herdproof/retryhttp v0.0.0
	go.uber.org/goleak v1.3.0
)

require (
	github.com/google/uuid v1.6.0 // indirect
	github.com/hashicorp/go-cleanhttp v0.5.2 // indirect
)

replace github.com/herdproof/retryhttp => ../
