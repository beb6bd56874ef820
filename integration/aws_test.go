package integration

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go/middleware"
	"github.com/herdproof/retryhttp"
	rht "github.com/herdproof/retryhttp/retryhttptest"
)

const (
	throttled = `{"__type":"com.amazonaws.dynamodb.v20120810#ThrottlingException","message":"Rate of requests exceeds the allowed throughput."}`
	item      = `{"Item":{"pk":{"S":"order-42"},"total":{"N":"100"}}}`
)

// dynamoSteps answers as DynamoDB does under load: a ThrottlingException
// (400, with x-amz-retry-after), a 503, then the item.
func dynamoSteps() []rht.Step {
	return []rht.Step{
		rht.Status(400).WithBody(throttled).WithHeader("Content-Type", "application/x-amz-json-1.0").WithHeader("X-Amz-Retry-After", "20"),
		rht.Status(503).WithBody(`{"__type":"com.amazonaws.dynamodb.v20120810#ServiceUnavailable"}`).WithHeader("Content-Type", "application/x-amz-json-1.0"),
		rht.Status(200).WithBody(item).WithHeader("Content-Type", "application/x-amz-json-1.0"),
	}
}

// dynamoClient is a DynamoDB client of url through httpClient, its bodies
// replayable, with the options optFns change.
func dynamoClient(url string, httpClient *http.Client, retryer func() aws.Retryer, optFns ...func(*dynamodb.Options)) *dynamodb.Client {
	return dynamodb.New(dynamodb.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(url),
		Credentials:  credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "secret", ""),
		HTTPClient:   httpClient,
		Retryer:      retryer(),
		APIOptions:   []func(*middleware.Stack) error{ReplayableBodies},
	}, optFns...)
}

// oneAttempt is the SDK's retryer of the guide's setup: one attempt.
func oneAttempt() aws.Retryer { return retry.AddWithMaxAttempts(retry.NewStandard(), 1) }

func getItem(ctx context.Context, c *dynamodb.Client) (*dynamodb.GetItemOutput, error) {
	return c.GetItem(ctx, &dynamodb.GetItemInput{
		TableName: aws.String("orders"),
		Key:       map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "order-42"}},
	})
}

// One retrying layer: the SDK's retries off (its documented way, a retryer
// of one attempt), the Transport retries. The endpoint sees exactly the
// Transport's attempts.
func TestDynamoDBOneLayer(t *testing.T) {
	srv := rht.NewServer(t, dynamoSteps()...)
	var ours atomic.Int64
	var classes []retryhttp.Class
	p := AWSPolicy()
	p.BaseDelay, p.ThrottleBaseDelay = time.Millisecond, time.Millisecond
	tr := &retryhttp.Transport{Policy: p, OnAttempt: func(a retryhttp.Attempt) {
		ours.Add(1)
		classes = append(classes, a.Class)
	}}
	c := dynamoClient(srv.URL, &http.Client{Transport: tr}, oneAttempt)
	out, err := getItem(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	if got := out.Item["pk"].(*types.AttributeValueMemberS).Value; got != "order-42" {
		t.Errorf("got item %q; want order-42", got)
	}
	rht.AssertAttempts(t, srv, 3)
	if int(ours.Load()) != len(srv.Attempts()) {
		t.Errorf("the endpoint saw %d attempts, the Transport made %d; want the same: one layer", len(srv.Attempts()), ours.Load())
	}
	if len(classes) != 3 || classes[0] != retryhttp.Throttling || classes[1] != retryhttp.Transient {
		t.Errorf("got classes %v; want [throttling transient success]", classes)
	}
	// The server asked for 20ms (x-amz-retry-after): the wait honoured it.
	if gap := rht.Gaps(srv)[0]; gap < 20*time.Millisecond {
		t.Errorf("got a wait of %v after x-amz-retry-after: 20; want at least 20ms", gap)
	}
	// The SDK's invocation id is the key: the same on every attempt, and no
	// Idempotency-Key was added to the signed request.
	as := srv.Attempts()
	for i, a := range as {
		if id := a.Header.Get("Amz-Sdk-Invocation-Id"); id == "" || id != as[0].Header.Get("Amz-Sdk-Invocation-Id") {
			t.Errorf("attempt %d: got invocation id %q; want the first attempt's", i+1, id)
		}
		if a.Key != "" {
			t.Errorf("attempt %d: got an Idempotency-Key %q; want none added", i+1, a.Key)
		}
		if !strings.Contains(a.Header.Get("Authorization"), "AWS4-HMAC-SHA256") {
			t.Errorf("attempt %d: the request is not signed", i+1)
		}
	}
}

// Both layers on: the SDK's standard retryer (3 attempts) over the
// Transport (3 attempts) against an endpoint that always throttles. The
// attempts multiply: this is why one of them must be off.
func TestDynamoDBTwoLayersMultiply(t *testing.T) {
	srv := rht.NewServer(t, rht.Status(400).WithBody(throttled).WithHeader("Content-Type", "application/x-amz-json-1.0"))
	p := AWSPolicy()
	p.BaseDelay, p.ThrottleBaseDelay = time.Millisecond, time.Millisecond
	tr := &retryhttp.Transport{Policy: p}
	c := dynamoClient(srv.URL, &http.Client{Transport: tr}, func() aws.Retryer {
		return retry.NewStandard(func(o *retry.StandardOptions) {
			o.Backoff = retry.BackoffDelayerFunc(func(int, error) (time.Duration, error) { return time.Millisecond, nil })
		})
	})
	if _, err := getItem(context.Background(), c); err == nil {
		t.Fatal("got an item from an endpoint that always throttles")
	}
	n := len(srv.Attempts())
	t.Logf("SDK retries on (3 attempts) over the Transport (3 attempts): %d attempts reached the endpoint for one call", n)
	if n != 9 {
		t.Errorf("got %d attempts at the endpoint; want 3 x 3 = 9", n)
	}
}

func TestAWSClassifyReadsABoundedPrefix(t *testing.T) {
	long := throttled + strings.Repeat(" ", 1<<20)
	resp := &http.Response{StatusCode: 400, Body: io.NopCloser(strings.NewReader(long))}
	if got := AWSClassify(nil)(resp, nil); got != retryhttp.Throttling {
		t.Errorf("got %v; want throttling", got)
	}
	b, _ := io.ReadAll(resp.Body)
	if string(b) != long {
		t.Errorf("the body reads %d bytes after classification; want all %d", len(b), len(long))
	}
	for _, tc := range []struct {
		body string
		want retryhttp.Class
	}{
		{`<Error><Code>SlowDown</Code></Error>`, retryhttp.Throttling},
		{`{"__type":"com.amazonaws.dynamodb.v20120810#ValidationException"}`, retryhttp.Permanent},
		{strings.Repeat("x", 2000) + `"ThrottlingException"`, retryhttp.Permanent}, // beyond the 1 KiB peek
	} {
		resp := &http.Response{StatusCode: 400, Body: io.NopCloser(strings.NewReader(tc.body))}
		if got := AWSClassify(nil)(resp, nil); got != tc.want {
			t.Errorf("body %.40q: got %v; want %v", tc.body, got, tc.want)
		}
	}
}

// Without ReplayableBodies the SDK's requests carry no GetBody: the
// Transport cannot send their bodies again and says so.
func TestDynamoDBWithoutReplayableBodies(t *testing.T) {
	srv := rht.NewServer(t, dynamoSteps()...)
	var decisions []retryhttp.Decision
	tr := &retryhttp.Transport{Policy: AWSPolicy(), OnAttempt: func(a retryhttp.Attempt) { decisions = append(decisions, a.Decision) }}
	c := dynamodb.New(dynamodb.Options{
		Region: "us-east-1", BaseEndpoint: aws.String(srv.URL),
		Credentials: credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "secret", ""),
		HTTPClient:  &http.Client{Transport: tr},
		Retryer:     retry.AddWithMaxAttempts(retry.NewStandard(), 1),
	})
	if _, err := getItem(context.Background(), c); err == nil {
		t.Fatal("got an item; want the throttling error (no retry possible)")
	}
	if len(decisions) != 1 || decisions[0] != retryhttp.StopNotReplayable {
		t.Errorf("got decisions %v; want [%v]", decisions, retryhttp.StopNotReplayable)
	}
}

// The guide's setups under a config whose RetryMaxAttempts is set (the
// AWS_MAX_ATTEMPTS environment variable, max_attempts in ~/.aws/config, or
// config.WithRetryMaxAttempts all set it): the client re-wraps the Retryer
// with that many attempts after the option functions ran. AWSRetryer
// retries no throttling whatever its count, and a retryer of one attempt
// needs o.RetryMaxAttempts = 1 as well, or attempts multiply (9 for 3).
func TestGuideSetupIsOneLayerUnderConfiguredMaxAttempts(t *testing.T) {
	tests := []struct {
		name        string
		retryer     func() aws.Retryer
		maxAttempts int
	}{
		{"AWSRetryer", AWSRetryer, 0},
		{"the SDK's retries off", oneAttempt, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := rht.NewServer(t, rht.Status(400).WithBody(throttled).WithHeader("Content-Type", "application/x-amz-json-1.0"))
			p := AWSPolicy()
			p.BaseDelay, p.ThrottleBaseDelay = time.Millisecond, time.Millisecond
			tr := &retryhttp.Transport{Policy: p}
			cfg := aws.Config{Region: "us-east-1", BaseEndpoint: aws.String(srv.URL),
				Credentials:      credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "secret", ""),
				RetryMaxAttempts: 3}
			client := dynamodb.NewFromConfig(cfg, func(o *dynamodb.Options) {
				o.HTTPClient = &http.Client{Transport: tr}
				o.Retryer = tt.retryer()
				o.RetryMaxAttempts = tt.maxAttempts
				o.APIOptions = append(o.APIOptions, ReplayableBodies)
			})
			getItem(context.Background(), client)
			if got := len(srv.Attempts()); got != 3 {
				t.Errorf("got %d attempts at the endpoint; want 3", got)
			}
		})
	}
}
