package integration

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"github.com/aws/aws-sdk-go-v2/aws/protocol/restjson"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/herdproof/retryhttp"
)

// Our code lists are the SDK's own, at the version this module requires.
func TestAWSCodeListsMatchTheSDK(t *testing.T) {
	sorted := func(m map[string]bool) []string { return slices.Sorted(maps.Keys(m)) }
	if got, want := sorted(awsThrottleCodes), slices.Sorted(maps.Keys(retry.DefaultThrottleErrorCodes)); !slices.Equal(got, want) {
		t.Errorf("throttle codes: got %v; want the SDK's %v", got, want)
	}
	if got, want := sorted(awsTransientCodes), slices.Sorted(maps.Keys(retry.DefaultRetryableErrorCodes)); !slices.Equal(got, want) {
		t.Errorf("retryable codes: got %v; want the SDK's %v", got, want)
	}
	for code := range retry.DefaultRetryableHTTPStatusCodes {
		resp := &http.Response{StatusCode: code, Header: http.Header{}, Body: http.NoBody}
		if got := AWSClassify(nil)(resp, nil); got != retryhttp.Transient {
			t.Errorf("status %d, no error code: got %v; want Transient, as the SDK retries it", code, got)
		}
	}
}

func TestAWSClassifyPerCode(t *testing.T) {
	type tc struct {
		name   string
		status int
		header string // x-amzn-ErrorType, "" for none
		body   string
		want   retryhttp.Class
	}
	var tests []tc
	for code := range awsThrottleCodes {
		tests = append(tests,
			tc{code + "/JSON 400", 400, "", `{"__type":"com.amazonaws.x#` + code + `","message":"slow down"}`, retryhttp.Throttling},
			tc{code + "/XML 503", 503, "", `<?xml version="1.0"?><Error><Code>` + code + `</Code></Error>`, retryhttp.Throttling},
			tc{code + "/header 400", 400, code + ":http://internal.amazon.com/coral/", `{}`, retryhttp.Throttling})
	}
	tests = append(tests,
		tc{"S3 SlowDown 503", 503, "", `<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>`, retryhttp.Throttling},
		tc{"RequestTimeout 400", 400, "", `<Error><Code>RequestTimeout</Code></Error>`, retryhttp.Transient},
		tc{"RequestTimeoutException 400", 400, "", `{"__type":"RequestTimeoutException"}`, retryhttp.Transient},
		tc{"InternalError 500", 500, "", `<Error><Code>InternalError</Code></Error>`, retryhttp.Transient},
		tc{"InternalServerError 500 JSON", 500, "", `{"code": "InternalServerError"}`, retryhttp.Transient},
		tc{"500 without a body", 500, "", ``, retryhttp.Transient},
		tc{"ServiceUnavailable 503", 503, "", `{"__type":"com.amazonaws.dynamodb.v20120810#ServiceUnavailable"}`, retryhttp.Transient},
		tc{"429 unmodeled", 429, "", `{}`, retryhttp.Throttling},
		tc{"ValidationException 400", 400, "", `{"__type":"com.amazonaws.dynamodb.v20120810#ValidationException"}`, retryhttp.Permanent},
		tc{"AccessDenied 403", 403, "", `<Error><Code>AccessDenied</Code></Error>`, retryhttp.Permanent},
		tc{"NoSuchKey 404", 404, "", `<Error><Code>NoSuchKey</Code></Error>`, retryhttp.Permanent},
		tc{"501", 501, "", ``, retryhttp.Permanent},
		tc{"200 with a throttle word in the body", 200, "", `{"__type":"ThrottlingException"}`, retryhttp.Success},
	)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := &http.Response{StatusCode: tc.status, Header: http.Header{}, Body: io.NopCloser(strings.NewReader(tc.body))}
			if tc.header != "" {
				resp.Header.Set("X-Amzn-ErrorType", tc.header)
			}
			if got := AWSClassify(nil)(resp, nil); got != tc.want {
				t.Errorf("got %v; want %v", got, tc.want)
			}
			if b, _ := io.ReadAll(resp.Body); string(b) != tc.body {
				t.Errorf("the body reads %q after classification; want it whole", b)
			}
		})
	}
}

// The SDK's PutItem with a 1 MiB attribute against a server that answers
// 503 before reading the body: the retry must send the whole body, although
// net/http may still be reading the first attempt's when the Transport asks
// GetBody for the second.
func TestReplayableBodiesGiveIndependentReaders(t *testing.T) {
	var (
		mu      sync.Mutex
		seen    = map[string]int{}
		partial int
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("Amz-Sdk-Invocation-Id")
		mu.Lock()
		seen[id]++
		first := seen[id] == 1
		mu.Unlock()
		if first {
			w.Header().Set("Content-Type", "application/x-amz-json-1.0")
			w.WriteHeader(503) // before reading a byte of the body
			io.WriteString(w, `{"__type":"com.amazonaws.dynamodb.v20120810#ServiceUnavailable"}`)
			return
		}
		b, err := io.ReadAll(r.Body)
		if err != nil || int64(len(b)) != r.ContentLength || !json.Valid(b) {
			mu.Lock()
			partial++
			mu.Unlock()
			http.Error(w, "bad body", 400)
			return
		}
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		io.WriteString(w, `{}`)
	}))
	defer srv.Close()
	tr := &retryhttp.Transport{Policy: AWSPolicy()}
	tr.Policy.BaseDelay = time.Millisecond
	defer tr.CloseIdleConnections()
	c := dynamoClient(srv.URL, &http.Client{Transport: tr}, oneAttempt)
	big := strings.Repeat("x", 1<<20)
	failed := 0
	for i := range 30 {
		_, err := c.PutItem(context.Background(), &dynamodb.PutItemInput{
			TableName: aws.String("orders"),
			Item: map[string]types.AttributeValue{
				"pk":   &types.AttributeValueMemberS{Value: fmt.Sprintf("order-%d", i)},
				"blob": &types.AttributeValueMemberS{Value: big},
			},
		})
		if err != nil {
			failed++
			t.Logf("PutItem %d: %v", i, err)
		}
	}
	if failed != 0 || partial != 0 {
		t.Errorf("got %d of 30 PutItem calls failed and %d partial bodies at the server; want 0 and 0", failed, partial)
	}
	if len(seen) != 30 {
		t.Errorf("got %d operations at the server; want 30", len(seen))
	}
	for id, n := range seen {
		if n != 2 {
			t.Errorf("operation %s: got %d attempts; want 2", id, n)
		}
	}
}

// The error code forms of the Smithy AWS protocols (and their protocol
// tests: RestJsonFooErrorUsingXAmznErrorTypeWithUriAndNamespace,
// RestJsonFooErrorWithDunderTypeUriAndNamespace): a namespace before '#',
// a URI after ':', in the header and in __type. The SDK strips both
// (restjson.SanitizeErrorCode) before it compares the code with its
// throttle list; AWSClassify must find the same code.
func TestAWSClassifyErrorCodeForms(t *testing.T) {
	const uri = ":http://internal.amazon.com/coral/com.amazon.coral.availability/"
	for _, tc := range []struct {
		name, header, body string
	}{
		{"header namespace#code", "com.amazonaws.dynamodb.v20120810#ThrottlingException", `{}`},
		{"header namespace#code:uri", "aws.protocoltests.restjson#ThrottlingException" + uri, `{}`},
		{"__type namespace#code:uri", "", `{"__type":"com.amazonaws.dynamodb.v20120810#ThrottlingException` + uri + `"}`},
		{"__type code:uri", "", `{"__type":"ThrottlingException` + uri + `"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The oracle: the code the SDK itself would compare.
			raw := tc.header
			if raw == "" {
				_, after, _ := strings.Cut(tc.body, `"__type":"`)
				raw, _, _ = strings.Cut(after, `"`)
			}
			if sdk := restjson.SanitizeErrorCode(raw); sdk != "ThrottlingException" {
				t.Fatalf("the SDK reads code %q; the test expects ThrottlingException", sdk)
			}
			resp := &http.Response{StatusCode: 400, Header: http.Header{}, Body: io.NopCloser(strings.NewReader(tc.body))}
			if tc.header != "" {
				resp.Header.Set("X-Amzn-ErrorType", tc.header)
			}
			if got := AWSClassify(nil)(resp, nil); got != retryhttp.Throttling {
				t.Errorf("got %v; want %v (the SDK reads ThrottlingException)", got, retryhttp.Throttling)
			}
		})
	}
}

// A client with EnableAcceptEncodingGzip asks for gzip and the SDK
// decompresses itself; the Transport's classifier peeks compressed bytes and
// finds no code, so a ThrottlingException is Permanent and never retried.
func TestAWSClassifyGzipErrorBody(t *testing.T) {
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		body := []byte(item)
		status := 200
		if calls.Add(1) == 1 {
			body, status = []byte(throttled), 400
		}
		if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			var b bytes.Buffer
			zw := gzip.NewWriter(&b)
			zw.Write(body)
			zw.Close()
			body = b.Bytes()
			w.Header().Set("Content-Encoding", "gzip")
		}
		w.WriteHeader(status)
		w.Write(body)
	}))
	defer srv.Close()
	var classes []retryhttp.Class
	p := AWSPolicy()
	p.BaseDelay, p.ThrottleBaseDelay = time.Millisecond, time.Millisecond
	tr := &retryhttp.Transport{Policy: p, OnAttempt: func(a retryhttp.Attempt) { classes = append(classes, a.Class) }}
	c := dynamoClient(srv.URL, &http.Client{Transport: tr}, oneAttempt, func(o *dynamodb.Options) { o.EnableAcceptEncodingGzip = true })
	_, err := getItem(context.Background(), c)
	if len(classes) == 0 || classes[0] != retryhttp.Throttling {
		t.Errorf("got classes %v (err %v); want the first throttling, as the SDK reads it", classes, err)
	}
}
