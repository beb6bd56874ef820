package retryhttp

import (
	"context"
	"net/http"
	"net/url"
)

// A proxyConnectError is a forward proxy's refusal to open a CONNECT
// tunnel to the origin: any status but 200. Nothing reached the origin, so
// even a write without a key may be retried. DefaultClassify reads its
// status as it reads a response's. net/http reports such a refusal as free
// text; CheckProxyConnect reports it as a *proxyConnectError instead.
type proxyConnectError struct {
	// StatusCode is the proxy's status code, e.g. 503.
	StatusCode int
	// Status is its status line, e.g. "503 Service Unavailable".
	Status string
}

func (e *proxyConnectError) Error() string {
	return "retryhttp: proxy refused CONNECT: " + e.Status
}

// CheckProxyConnect is an http.Transport.OnProxyConnectResponse. It turns
// a proxy's refusal of a CONNECT tunnel into an error that DefaultClassify
// reads by its status. Nothing reached the origin, so even a write without
// a key may be retried. The Transport's default base has it. Set it on a
// base of your own that goes through a proxy:
//
//	base := &http.Transport{Proxy: http.ProxyFromEnvironment, OnProxyConnectResponse: retryhttp.CheckProxyConnect}
func CheckProxyConnect(_ context.Context, _ *url.URL, _ *http.Request, resp *http.Response) error {
	if resp.StatusCode == http.StatusOK { // net/http accepts 200 only
		return nil
	}
	return &proxyConnectError{StatusCode: resp.StatusCode, Status: resp.Status}
}
