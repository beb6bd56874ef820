// Package integration shows retryhttp as the one retrying layer under real
// SDK clients, the AWS SDK for Go v2 and stripe-go, against local endpoints
// that answer as the services do. It is a module of its own so that the SDKs
// stay out of the library's dependencies.
package integration

import (
	"bytes"
	"net/http"

	"github.com/herdproof/retryhttp"
)

// awsThrottleCodes are the AWS error codes that mean "slow down", as the AWS
// SDK for Go v2 lists them (aws/retry DefaultThrottleErrorCodes).
var awsThrottleCodes = []string{
	"Throttling", "ThrottlingException", "ThrottledException", "RequestThrottledException",
	"TooManyRequestsException", "ProvisionedThroughputExceededException",
	"TransactionInProgressException", "RequestLimitExceeded", "BandwidthLimitExceeded",
	"LimitExceededException", "RequestThrottled", "SlowDown", "PriorRequestNotComplete",
	"EC2ThrottledException",
}

// peekLimit bounds what the classifier reads of an error body: AWS puts the
// error code at its start (JSON "__type", XML <Code>).
const peekLimit = 1024

// AWSClassify returns a classifier for AWS services: a 400 whose body names a
// throttling error code (DynamoDB's ThrottlingException, for one) is
// Throttling; everything else is left to next (DefaultClassify if nil). It
// reads at most the first 1 KiB of a 400's body, with retryhttp.PeekBody,
// and puts it back for the SDK to read.
func AWSClassify(next func(*http.Response, error) retryhttp.Class) func(*http.Response, error) retryhttp.Class {
	if next == nil {
		next = retryhttp.DefaultClassify
	}
	return func(resp *http.Response, err error) retryhttp.Class {
		if resp != nil && resp.StatusCode == http.StatusBadRequest {
			prefix, _ := retryhttp.PeekBody(resp, peekLimit)
			for _, code := range awsThrottleCodes {
				if bytes.Contains(prefix, []byte(`#`+code+`"`)) || bytes.Contains(prefix, []byte(`"`+code+`"`)) ||
					bytes.Contains(prefix, []byte(`<Code>`+code+`</Code>`)) {
					return retryhttp.Throttling
				}
			}
		}
		return next(resp, err)
	}
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
