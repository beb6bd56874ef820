package check

// The packages the docs' Go snippets import, beyond the standard library:
// listed here so that this module requires them (go mod tidy keeps what
// is imported). A snippet that imports a package missing here fails to
// build with "no required module provides package": add it here, then run
// go mod tidy. The package names the snippets may use without an import
// are in imports (snippets.go).
import (
	_ "github.com/aws/aws-sdk-go-v2/aws"
	_ "github.com/aws/aws-sdk-go-v2/aws/retry"
	_ "github.com/aws/aws-sdk-go-v2/service/dynamodb"
	_ "github.com/herdproof/retryhttp"
	_ "github.com/herdproof/retryhttp/integration"
	_ "github.com/herdproof/retryhttp/otelretry"
	_ "github.com/herdproof/retryhttp/redisbudget"
	_ "github.com/herdproof/retryhttp/retryhttptest"
	_ "github.com/redis/go-redis/v9"
	_ "github.com/stripe/stripe-go/v82"
	_ "go.opentelemetry.io/otel"
	_ "go.opentelemetry.io/otel/attribute"
)
