// Package integration shows retryhttp as the one retrying layer under real
// SDK clients, the AWS SDK for Go v2 and stripe-go, against local endpoints
// that answer as the services do. It is a module of its own so that the SDKs
// stay out of the library's dependencies.
package integration

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"strings"

	"github.com/herdproof/retryhttp"
)

// The AWS error codes the AWS SDK for Go v2 retries in its standard mode
// (aws/retry, v1.48.0: DefaultThrottleErrorCodes, DefaultRetryableErrorCodes),
// copied here as data so that no SDK package is needed to classify; the
// table test in awsclassify_test.go checks each against the SDK's own lists.
var (
	awsThrottleCodes = map[string]bool{
		"Throttling": true, "ThrottlingException": true, "ThrottledException": true,
		"RequestThrottledException": true, "TooManyRequestsException": true,
		"ProvisionedThroughputExceededException": true, "TransactionInProgressException": true,
		"RequestLimitExceeded": true, "BandwidthLimitExceeded": true, "LimitExceededException": true,
		"RequestThrottled": true, "SlowDown": true, "PriorRequestNotComplete": true,
		"EC2ThrottledException": true,
	}
	awsTransientCodes = map[string]bool{"RequestTimeout": true, "RequestTimeoutException": true}
)

// peekLimit bounds what the classifier reads of an error body: AWS puts the
// error code at its start (JSON "__type" or "code", XML <Code>).
const peekLimit = 1024

// AWSClassify returns a classifier that retries what the AWS SDK for Go v2's
// standard mode retries:
//
//   - a throttling error code (ThrottlingException, S3's SlowDown, ...) is
//     Throttling, whatever the status: S3 sends SlowDown as a 503, which
//     would otherwise be a plain transient failure with a shorter backoff
//     and a higher retry cost;
//   - RequestTimeout and RequestTimeoutException (S3 sends a 400) are
//     Transient;
//   - 500 (InternalError and the like), 502, 503 and 504 are Transient: AWS
//     operations are designed to be retried after them, as the SDK does;
//   - everything else is left to next (DefaultClassify if nil): 429 is
//     Throttling, network failures are Transient, other 4xx are Permanent.
//
// The error code is read from the x-amzn-ErrorType header when present, and
// otherwise from at most the first 1 KiB of an error response's body, with
// retryhttp.PeekBody, which puts it back for the SDK to read.
func AWSClassify(next func(*http.Response, error) retryhttp.Class) func(*http.Response, error) retryhttp.Class {
	if next == nil {
		next = retryhttp.DefaultClassify
	}
	return func(resp *http.Response, err error) retryhttp.Class {
		if resp == nil || resp.StatusCode < 400 {
			return next(resp, err)
		}
		code := awsErrorCode(resp)
		switch {
		case awsThrottleCodes[code]:
			return retryhttp.Throttling
		case awsTransientCodes[code], resp.StatusCode == http.StatusInternalServerError:
			return retryhttp.Transient
		}
		return next(resp, err)
	}
}

// awsErrorCode returns the error code of an AWS error response, "" if none
// is found: the x-amzn-ErrorType header ("Code:namespace-uri"), an XML
// <Code> element, or a JSON "__type" ("namespace#Code") or "code" member.
func awsErrorCode(resp *http.Response) string {
	if h := resp.Header.Get("X-Amzn-Errortype"); h != "" {
		return sanitizeCode(h)
	}
	prefix, _ := retryhttp.PeekBody(resp, peekLimit)
	if strings.EqualFold(strings.TrimSpace(resp.Header.Get("Content-Encoding")), "gzip") {
		// The SDK asked for gzip (EnableAcceptEncodingGzip) and decompresses
		// itself: read the code from the decompressed start of the prefix.
		if zr, err := gzip.NewReader(bytes.NewReader(prefix)); err == nil {
			prefix, _ = io.ReadAll(io.LimitReader(zr, peekLimit))
		}
	}
	if v, ok := between(prefix, "<Code>", "</Code>"); ok {
		return v
	}
	for _, key := range []string{`"__type"`, `"code"`, `"Code"`} {
		i := bytes.Index(prefix, []byte(key))
		if i < 0 {
			continue
		}
		rest := bytes.TrimLeft(prefix[i+len(key):], " \t\r\n")
		if !bytes.HasPrefix(rest, []byte(":")) {
			continue
		}
		rest = bytes.TrimLeft(rest[1:], " \t\r\n")
		if v, ok := between(rest, `"`, `"`); ok {
			return sanitizeCode(v)
		}
	}
	return ""
}

// sanitizeCode strips what the AWS protocols may put around an error code,
// as the SDK does (restjson.SanitizeErrorCode): a URI after ':' and a
// namespace before '#'.
func sanitizeCode(v string) string {
	v, _, _ = strings.Cut(v, ":")
	if _, after, found := strings.Cut(v, "#"); found {
		v = after
	}
	return strings.TrimSpace(v)
}

// between returns the text of b between the first open and the next close.
func between(b []byte, open, close string) (string, bool) {
	i := bytes.Index(b, []byte(open))
	if i < 0 {
		return "", false
	}
	rest := b[i+len(open):]
	j := bytes.Index(rest, []byte(close))
	if j < 0 {
		return "", false
	}
	return string(rest[:j]), true
}

// AWSPolicy is the Policy to put under an AWS SDK client whose own retries
// are off: AWS error bodies classified, and the SDK's amz-sdk-invocation-id
// (one per operation, the same on every attempt) used as the idempotency
// key, so that writes are retried and no extra header is sent.
func AWSPolicy() retryhttp.Policy {
	return retryhttp.Policy{
		Classify:          AWSClassify(nil),
		IdempotencyHeader: "Amz-Sdk-Invocation-Id",
	}
}
