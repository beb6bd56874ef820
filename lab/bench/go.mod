module github.com/herdproof/retryhttp/lab/bench

go 1.25

require (
	github.com/aws/aws-sdk-go-v2 v1.48.0
	github.com/aws/aws-sdk-go-v2/credentials v1.21.0
	github.com/aws/aws-sdk-go-v2/service/sts v1.52.0
	github.com/failsafe-go/failsafe-go v0.9.8
	github.com/hashicorp/go-retryablehttp v0.7.8
	github.com/herdproof/retryhttp v0.1.0
)

require (
	github.com/aws/aws-sdk-go-v2/internal/configsources v1.5.12 // indirect
	github.com/aws/aws-sdk-go-v2/internal/endpoints/v2 v2.8.12 // indirect
	github.com/aws/aws-sdk-go-v2/internal/v4a v1.5.12 // indirect
	github.com/aws/aws-sdk-go-v2/service/internal/accept-encoding v1.13.25 // indirect
	github.com/aws/aws-sdk-go-v2/service/internal/presigned-url v1.14.12 // indirect
	github.com/aws/smithy-go v1.28.9 // indirect
	github.com/bits-and-blooms/bitset v1.24.4 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/hashicorp/go-cleanhttp v0.5.2 // indirect
	github.com/influxdata/tdigest v0.0.1 // indirect
)

// Development against this checkout; ignored by the module's users, who get
// the required version (see docs/releasing.md).
replace github.com/herdproof/retryhttp => ../../
