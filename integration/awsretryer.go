package integration

import (
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
)

// AWSRetryer returns the SDK retryer to give an AWS SDK for Go v2 client
// whose HTTP client is a retryhttp Transport. The Transport makes the
// retries; the SDK makes a second attempt for one failure only, which the
// Transport cannot retry: a request refused for clock skew
// (InvalidSignatureException, RequestTimeTooSkewed, SignatureDoesNotMatch,
// ... when the response's Date is more than 4 minutes from the signing
// time). Such a request has to be signed again with the skew observed, and
// only the SDK signs. The second attempt is made at once and from no retry
// quota; any other error ends the operation after the SDK's first attempt,
// so that the two layers never multiply. (A client may add error codes of
// its own to whatever retryer it is given: STS's retries
// IDPCommunicationError, which then gets the second attempt too.)
//
// Set the client's RetryMaxAttempts to 0 with it, so that a RetryMaxAttempts
// taken from the config (AWS_MAX_ATTEMPTS, max_attempts,
// config.WithRetryMaxAttempts) does not wrap the retryer again with another
// count of attempts for clock skew.
func AWSRetryer() aws.Retryer {
	return retry.NewStandard(func(o *retry.StandardOptions) {
		o.MaxAttempts = 2
		// The SDK marks a clock-skew refusal it will sign again as
		// retryable (retry.RetryableError's interface); nothing else it
		// sees after the Transport is.
		o.Retryables = []retry.IsErrorRetryable{retry.RetryableError{}}
		o.RateLimiter = ratelimit.None
		o.Backoff = retry.BackoffDelayerFunc(func(int, error) (time.Duration, error) { return 0, nil })
	})
}
