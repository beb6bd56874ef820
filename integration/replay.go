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
// body (StopNotReplayable).
//
// Each GetBody returns a reader of its own over the SDK's payload, starting
// where the payload starts, so nothing is buffered and no two attempts share
// a read position: net/http may still be reading the previous attempt's body
// when the Transport asks for the next one (a body may be read and closed
// after RoundTrip returns), and a shared stream rewound under it would send
// a corrupt request. That needs a payload that can be read at an offset
// (io.ReaderAt), as the SDK's serialized request bodies (*bytes.Reader),
// strings.Reader and *os.File are. Any other payload gets no GetBody and is
// not retried by the Transport.
//
//	client := dynamodb.NewFromConfig(cfg, func(o *dynamodb.Options) {
//		o.HTTPClient = &http.Client{Transport: &retryhttp.Transport{Policy: integration.AWSPolicy()}}
//		o.Retryer = integration.AWSRetryer()
//		o.RetryMaxAttempts = 0 // else AWS_MAX_ATTEMPTS re-wraps the Retryer
//		o.APIOptions = append(o.APIOptions, integration.ReplayableBodies)
//	})
func ReplayableBodies(stack *middleware.Stack) error {
	return stack.Finalize.Add(middleware.FinalizeMiddlewareFunc("RetryHTTPReplayableBody",
		func(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
			if req, ok := in.Request.(*smithyhttp.Request); ok {
				if getBody := independentReaders(req); getBody != nil {
					req.Request.GetBody = getBody
				}
			}
			return next.HandleFinalize(ctx, in)
		}), middleware.After)
}

// independentReaders returns a GetBody whose every body reads req's payload
// from its start with a position of its own, or nil if the payload cannot be
// read at an offset.
func independentReaders(req *smithyhttp.Request) func() (io.ReadCloser, error) {
	stream := req.GetStream()
	ra, okAt := stream.(io.ReaderAt)
	seeker, okSeek := stream.(io.Seeker)
	if stream == nil || !okAt || !okSeek {
		return nil
	}
	// The payload starts where the stream stands now, at the end of the
	// middleware stack, before the first attempt reads it.
	start, err := seeker.Seek(0, io.SeekCurrent)
	if err != nil {
		return nil
	}
	length := req.ContentLength
	if length < 0 {
		end, err := seeker.Seek(0, io.SeekEnd)
		if err != nil {
			return nil
		}
		if _, err := seeker.Seek(start, io.SeekStart); err != nil {
			return nil
		}
		length = end - start
	}
	return func() (io.ReadCloser, error) {
		return io.NopCloser(io.NewSectionReader(ra, start, length)), nil
	}
}
