package integration

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
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
	dates []string
}

func (s *skewedDynamo) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	now := time.Now().Add(s.skew)
	amzDate := r.Header.Get("X-Amz-Date")
	s.mu.Lock()
	s.dates = append(s.dates, amzDate)
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

func (s *skewedDynamo) requests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.dates)
}

// The guide's setup with AWSRetryer: a clock-skew refusal is signed again
// by the SDK, once, and the SDK retries nothing else, so the endpoint sees
// the Transport's attempts alone; the same under a config whose
// RetryMaxAttempts is 5. With the SDK's retries off altogether, a
// clock-skew refusal fails.
func TestAWSRetryerSignsAgainAfterClockSkewOnly(t *testing.T) {
	unavailable := func(w http.ResponseWriter) {
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, `{"__type":"com.amazonaws.dynamodb.v20120810#ServiceUnavailable"}`)
	}
	throttle := func(w http.ResponseWriter) {
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, throttled)
	}
	tests := []struct {
		name       string
		retryer    func() aws.Retryer
		configured int // the config's RetryMaxAttempts
		skew       time.Duration
		fail       func(w http.ResponseWriter)
		requests   int
		code       string // the operation's error code; "" for none
	}{
		{"clock skew, signed again", AWSRetryer, 0, 10 * time.Minute, nil, 2, ""},
		{"clock skew ahead, signed again", AWSRetryer, 0, -10 * time.Minute, nil, 2, ""},
		{"clock skew, signed again under a configured max attempts", AWSRetryer, 5, 10 * time.Minute, nil, 2, ""},
		{"clock skew, then 503s: the Transport's attempts", AWSRetryer, 5, 10 * time.Minute, unavailable, 1 + 3, "ServiceUnavailable"},
		{"503s: the Transport's attempts alone", AWSRetryer, 5, 0, unavailable, 3, "ServiceUnavailable"},
		{"throttling: the Transport's attempts alone", AWSRetryer, 5, 0, throttle, 3, "ThrottlingException"},
		{"clock skew with the SDK's retries off", oneAttempt, 0, 10 * time.Minute, nil, 1, "InvalidSignatureException"},
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
			_, err := getItem(context.Background(), client)
			var code string
			if err != nil {
				var api smithy.APIError
				if !errors.As(err, &api) {
					t.Fatalf("got error %v; want an API error", err)
				}
				code = api.ErrorCode()
			}
			if code != tt.code {
				t.Errorf("got error code %q (%v); want %q", code, err, tt.code)
			}
			if got := h.requests(); got != tt.requests {
				t.Errorf("got %d requests at the endpoint (X-Amz-Date %v); want %d", got, h.dates, tt.requests)
			}
		})
	}
}
