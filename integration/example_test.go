package integration_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go/middleware"
	"github.com/herdproof/retryhttp"
	"github.com/herdproof/retryhttp/integration"
)

// A DynamoDB client whose one retrying layer is a Transport: the SDK makes
// one attempt per call, the Transport retries the throttling and the 503.
func ExampleAWSPolicy() {
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		switch calls.Add(1) {
		case 1:
			w.Header().Set("X-Amz-Retry-After", "10")
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprint(w, `{"__type":"com.amazonaws.dynamodb.v20120810#ThrottlingException"}`)
		case 2:
			w.WriteHeader(http.StatusServiceUnavailable)
		default:
			fmt.Fprint(w, `{"Item":{"pk":{"S":"order-42"}}}`)
		}
	}))
	defer srv.Close()

	tr := &retryhttp.Transport{Policy: integration.AWSPolicy(), OnAttempt: func(a retryhttp.Attempt) {
		fmt.Println("attempt", a.Number, a.Status, a.Class, "->", a.Decision)
	}}
	client := dynamodb.New(dynamodb.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(srv.URL),
		Credentials:  credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "secret", ""),
		HTTPClient:   &http.Client{Transport: tr},
		Retryer:      retry.AddWithMaxAttempts(retry.NewStandard(), 1),
		APIOptions:   []func(*middleware.Stack) error{integration.ReplayableBodies},
	})
	out, err := client.GetItem(context.Background(), &dynamodb.GetItemInput{
		TableName: aws.String("orders"),
		Key:       map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "order-42"}},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("item", out.Item["pk"].(*types.AttributeValueMemberS).Value, "after", calls.Load(), "calls")
	// Output:
	// attempt 1 400 throttling -> retry
	// attempt 2 503 transient -> retry
	// attempt 3 200 success -> done
	// item order-42 after 3 calls
}
