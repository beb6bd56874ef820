// Command dynamodb wraps an AWS SDK for Go v2 DynamoDB client with a
// retryhttp Transport as its one retrying layer, against a local endpoint
// that throttles twice (400 ThrottlingException with x-amz-retry-after,
// then 503) before it answers. No AWS account or network needed.
//
//	(cd integration && go run ./examples/dynamodb)
package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"sync/atomic"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go/middleware"
	"github.com/herdproof/retryhttp"
	"github.com/herdproof/retryhttp/integration"
)

func main() {
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		switch calls.Add(1) {
		case 1:
			w.Header().Set("X-Amz-Retry-After", "100")
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, `{"__type":"com.amazonaws.dynamodb.v20120810#ThrottlingException","message":"Rate exceeded"}`)
		case 2:
			w.WriteHeader(http.StatusServiceUnavailable)
		default:
			io.WriteString(w, `{"Item":{"pk":{"S":"order-42"},"total":{"N":"100"}}}`)
		}
	}))
	defer srv.Close()

	tr := &retryhttp.Transport{
		Policy: integration.AWSPolicy(), // AWS error bodies classified; the SDK's invocation id as the key
		OnAttempt: func(a retryhttp.Attempt) {
			if a.Decision == retryhttp.Retry {
				source := "backoff"
				if a.ServerDelay {
					source = "server"
				}
				fmt.Printf("attempt %d: %d %v -> retry in %v (%v)\n", a.Number, a.Status, a.Class, a.Delay, source)
			} else {
				fmt.Printf("attempt %d: %d %v -> %v\n", a.Number, a.Status, a.Class, a.Decision)
			}
		},
	}
	client := dynamodb.New(dynamodb.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(srv.URL),
		Credentials:  credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "secret", ""),
		HTTPClient:   &http.Client{Transport: tr},
		// One retrying layer: the Transport retries; the SDK makes a second
		// attempt only to sign again after a clock-skew refusal.
		Retryer:    integration.AWSRetryer(),
		APIOptions: []func(*middleware.Stack) error{integration.ReplayableBodies},
	})
	out, err := client.GetItem(context.Background(), &dynamodb.GetItemInput{
		TableName: aws.String("orders"),
		Key:       map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "order-42"}},
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("item %s after %d calls at the endpoint\n", out.Item["pk"].(*types.AttributeValueMemberS).Value, calls.Load())
}
