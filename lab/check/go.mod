module github.com/herdproof/retryhttp/lab/check

go 1.26.0

// Development against this checkout (this module is never published).
replace (
	github.com/herdproof/retryhttp => ../../
	github.com/herdproof/retryhttp/integration => ../../integration
	github.com/herdproof/retryhttp/otelretry => ../../otelretry
	github.com/herdproof/retryhttp/redisbudget => ../../redisbudget
)

require (
	github.com/aws/aws-sdk-go-v2 v1.48.0
	github.com/aws/aws-sdk-go-v2/service/dynamodb v1.74.0
	github.com/herdproof/retryhttp v0.1.0
	github.com/herdproof/retryhttp/integration v0.1.0
	github.com/herdproof/retryhttp/otelretry v0.1.0
	github.com/herdproof/retryhttp/redisbudget v0.1.0
	github.com/redis/go-redis/v9 v9.23.0
	github.com/stripe/stripe-go/v82 v82.5.1
	go.opentelemetry.io/otel v1.47.0
)

require (
	github.com/aws/aws-sdk-go-v2/internal/configsources v1.5.12 // indirect
	github.com/aws/aws-sdk-go-v2/internal/endpoints/v2 v2.8.12 // indirect
	github.com/aws/aws-sdk-go-v2/service/internal/accept-encoding v1.13.25 // indirect
	github.com/aws/aws-sdk-go-v2/service/internal/endpoint-discovery v1.13.12 // indirect
	github.com/aws/smithy-go v1.28.9 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/go-logr/logr v1.4.4 // indirect
	github.com/go-logr/stdr v1.2.2 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/hashicorp/go-cleanhttp v0.5.2 // indirect
	go.opentelemetry.io/auto/sdk v1.2.1 // indirect
	go.opentelemetry.io/otel/log v1.47.0 // indirect
	go.opentelemetry.io/otel/metric v1.47.0 // indirect
	go.opentelemetry.io/otel/trace v1.47.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
)
