package integration

import (
	"context"
	"io"

	"github.com/aws/smithy-go/middleware"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// ReplayableBodies is an AWS SDK APIOptions entry that gives each request a
// GetBody, so that a retrying Transport under the SDK can send its body
// again. The SDK builds its *http.Request without one (it rewinds the
// payload itself between its own attempts); with the SDK's retries off, the
// Transport would otherwise have to refuse every retry of a request with a
// body (StopNotReplayable). GetBody rewinds the SDK's own payload stream, as
// the SDK does for its retries, so nothing is buffered; a payload that
// cannot be rewound (a one-shot stream) gets no GetBody and is not retried.
//
//	client := dynamodb.NewFromConfig(cfg, func(o *dynamodb.Options) {
//		o.HTTPClient = &http.Client{Transport: &retryhttp.Transport{Policy: integration.AWSPolicy()}}
//		o.Retryer = retry.AddWithMaxAttempts(retry.NewStandard(), 1)
//		o.APIOptions = append(o.APIOptions, integration.ReplayableBodies)
//	})
func ReplayableBodies(stack *middleware.Stack) error {
	return stack.Finalize.Add(middleware.FinalizeMiddlewareFunc("RetryHTTPReplayableBody",
		func(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
			if req, ok := in.Request.(*smithyhttp.Request); ok && req.GetStream() != nil && req.IsStreamSeekable() {
				req.Request.GetBody = func() (io.ReadCloser, error) {
					if err := req.RewindStream(); err != nil {
						return nil, err
					}
					return io.NopCloser(req.GetStream()), nil
				}
			}
			return next.HandleFinalize(ctx, in)
		}), middleware.After)
}
