//go:build retryhttp_ablate

package retryhttp

import (
	"os"
	"strconv"
	"strings"
)

// The lab's ablation switch (lab/bench/ablate.sh), built only with the tag
// retryhttp_ablate: RETRYHTTP_ABLATE holds name=value pairs, comma
// separated, that replace the RateLimiter's tuned numbers, to measure each
// at its neutral value on the matrix.
func init() {
	vars := map[string]*float64{"beta": &limBeta, "margin": &limMargin, "tau": &limTau,
		"growth": &limGrowth, "wait": &limWait, "hold": &limHold}
	for _, kv := range strings.Split(os.Getenv("RETRYHTTP_ABLATE"), ",") {
		name, value, ok := strings.Cut(kv, "=")
		f, err := strconv.ParseFloat(value, 64)
		if p := vars[name]; ok && err == nil && p != nil {
			*p = f
		} else if kv != "" {
			panic("retryhttp: RETRYHTTP_ABLATE: cannot set " + kv)
		}
	}
}
