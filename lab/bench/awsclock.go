package bench

import (
	"context"
	"time"
	_ "unsafe" // go:linkname, to reach the SDK's sleep hook

	_ "github.com/aws/aws-sdk-go-v2/aws/retry" // links internal/sdk
)

// The AWS SDK's adaptive mode, asked for a send token its bucket cannot
// give, sleeps for the time the missing fraction of a token takes to refill
// (aws/retry/adaptive.go, GetAttemptToken; adaptive_ratelimit.go,
// AcquireToken), and asks again. The wait is truncated to whole
// nanoseconds, so after it the bucket is still short by less than a
// nanosecond's refill, and the next wait is zero. On a real clock that zero
// sleep lasts long enough for the bucket to fill; on synctest's fake clock,
// which moves only when every goroutine is blocked, it never ends: the
// waiter spins and the bubble hangs.
//
// internal/sdk.SleepWithContext is the SDK's own hook for tests ("can be
// overridden for testing and mocking out sleep duration"); from outside the
// SDK's module it can only be reached by linkname. This package's init
// replaces it once with the SDK's sleep made at least one nanosecond long: the SDK's loop, wait and sleep are otherwise its own, and
// on a real clock nothing changes (a timer of 0 or 1 ns fires at once).
//
//go:linkname awsSleepWithContext github.com/aws/aws-sdk-go-v2/internal/sdk.SleepWithContext
var awsSleepWithContext func(context.Context, time.Duration) error

func init() {
	sdkSleep := awsSleepWithContext
	awsSleepWithContext = func(ctx context.Context, d time.Duration) error {
		return sdkSleep(ctx, max(d, time.Nanosecond))
	}
}
