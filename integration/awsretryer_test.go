package integration

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
	"github.com/herdproof/retryhttp"
)

// skewedDynamo answers as DynamoDB does to a client whose clock is behind
// the server's by skew: a request signed more than 5 minutes from the
// server's time is refused with InvalidSignatureException, the response's
// Date showing the server's time; one signed in time gets the item, unless
// fail says what to answer instead. It records each request's X-Amz-Date.
type skewedDynamo struct {
	skew time.Duration
	fail func(w http.ResponseWriter) // nil: answer the item

	mu    sync.Mutex
	dates []string // each request's X-Amz-Date
	ids   []string // and Amz-Sdk-Invocation-Id
}

func (s *skewedDynamo) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	now := time.Now().Add(s.skew)
	amzDate := r.Header.Get("X-Amz-Date")
	s.mu.Lock()
	s.dates = append(s.dates, amzDate)
	s.ids = append(s.ids, r.Header.Get("Amz-Sdk-Invocation-Id"))
	s.mu.Unlock()
	w.Header().Set("Date", now.UTC().Format(http.TimeFormat))
	w.Header().Set("Content-Type", "application/x-amz-json-1.0")
	signed, err := time.Parse("20060102T150405Z", amzDate)
	if err != nil || signed.Sub(now).Abs() > 5*time.Minute {
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, `{"__type":"com.amazon.coral.service#InvalidSignatureException","message":"Signature expired"}`)
		return
	}
	if s.fail != nil {
		s.fail(w)
		return
	}
	io.WriteString(w, item)
}

// The guide's setup with AWSRetryer: a clock-skew refusal is signed again
// by the SDK, once, with the same invocation id (the Transport's
// idempotency key), and the SDK retries nothing else, so the endpoint sees
// the Transport's attempts alone; the same under a config whose
// RetryMaxAttempts is 5, and under an operation's own RetryMaxAttempts.
// With the SDK's retries off altogether, a clock-skew refusal fails.
func TestAWSRetryerSignsAgainAfterClockSkewOnly(t *testing.T) {
	unavailable := func(w http.ResponseWriter) {
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, `{"__type":"com.amazonaws.dynamodb.v20120810#ServiceUnavailable"}`)
	}
	throttle := func(w http.ResponseWriter) {
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, throttled)
	}
	reset := func(w http.ResponseWriter) {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			panic(err)
		}
		conn.(*net.TCPConn).SetLinger(0)
		conn.Close()
	}
	tests := []struct {
		name       string
		retryer    func() aws.Retryer
		configured int // the config's RetryMaxAttempts
		perCall    int // the operation's RetryMaxAttempts, if not 0
		skew       time.Duration
		fail       func(w http.ResponseWriter)
		requests   int
		code       string // the operation's error code; "" for none, "-" for an error without one
	}{
		{"clock skew, signed again", AWSRetryer, 0, 0, 10 * time.Minute, nil, 2, ""},
		{"clock skew ahead, signed again", AWSRetryer, 0, 0, -10 * time.Minute, nil, 2, ""},
		{"clock skew, signed again under a configured max attempts", AWSRetryer, 5, 0, 10 * time.Minute, nil, 2, ""},
		{"clock skew, then 503s: the Transport's attempts", AWSRetryer, 5, 0, 10 * time.Minute, unavailable, 1 + 3, "ServiceUnavailable"},
		{"503s: the Transport's attempts alone", AWSRetryer, 5, 0, 0, unavailable, 3, "ServiceUnavailable"},
		{"throttling: the Transport's attempts alone", AWSRetryer, 5, 0, 0, throttle, 3, "ThrottlingException"},
		{"throttling under an operation's max attempts", AWSRetryer, 5, 4, 0, throttle, 3, "ThrottlingException"},
		{"connection resets: the Transport's attempts alone", AWSRetryer, 5, 0, 0, reset, 3, "-"},
		{"clock skew with the SDK's retries off", oneAttempt, 0, 0, 10 * time.Minute, nil, 1, "InvalidSignatureException"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := &skewedDynamo{skew: tt.skew, fail: tt.fail}
			srv := httptest.NewServer(h)
			defer srv.Close()
			p := AWSPolicy()
			p.BaseDelay, p.ThrottleBaseDelay = time.Millisecond, time.Millisecond
			tr := &retryhttp.Transport{Policy: p}
			cfg := aws.Config{Region: "us-east-1", BaseEndpoint: aws.String(srv.URL),
				Credentials:      credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "secret", ""),
				RetryMaxAttempts: tt.configured}
			client := dynamodb.NewFromConfig(cfg, func(o *dynamodb.Options) {
				o.HTTPClient = &http.Client{Transport: tr}
				o.Retryer = tt.retryer()
				o.RetryMaxAttempts = 0 // the retryer's own count, whatever the config says
				o.APIOptions = append(o.APIOptions, ReplayableBodies)
			})
			var perCall []func(*dynamodb.Options)
			if tt.perCall > 0 {
				perCall = append(perCall, func(o *dynamodb.Options) { o.RetryMaxAttempts = tt.perCall })
			}
			_, err := client.GetItem(context.Background(), &dynamodb.GetItemInput{
				TableName: aws.String("orders"),
				Key:       map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "order-42"}},
			}, perCall...)
			var code string
			if err != nil {
				code = "-"
				if api := smithy.APIError(nil); errors.As(err, &api) {
					code = api.ErrorCode()
				}
			}
			if code != tt.code {
				t.Errorf("got error code %q (%v); want %q", code, err, tt.code)
			}
			h.mu.Lock()
			defer h.mu.Unlock()
			if got := len(h.dates); got != tt.requests {
				t.Errorf("got %d requests at the endpoint (X-Amz-Date %v); want %d", got, h.dates, tt.requests)
			}
			if tt.skew != 0 && len(h.dates) >= 2 && h.dates[0] == h.dates[1] {
				t.Errorf("the second request was signed at %s as the first; want it signed again", h.dates[1])
			}
			for i, id := range h.ids {
				if id == "" || id != h.ids[0] {
					t.Errorf("request %d has invocation id %q; want the operation's one, %q", i+1, id, h.ids[0])
				}
			}
		})
	}
}
