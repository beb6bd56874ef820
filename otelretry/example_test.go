package otelretry_test

import (
	"context"
	"fmt"
	"net/http"

	"github.com/herdproof/retryhttp"
	"github.com/herdproof/retryhttp/otelretry"
	"github.com/herdproof/retryhttp/retryhttptest"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

func ExampleMetrics_Instrument() {
	reader := sdkmetric.NewManualReader()
	m, _ := otelretry.New(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	defer m.Close()

	// A dependency that fails twice, then answers; zero waits for the example.
	base := retryhttptest.NewTransport(retryhttptest.Status(503).Times(2), retryhttptest.Status(200))
	tr := &retryhttp.Transport{Base: base, Policy: retryhttp.Policy{Rand: func(int64) int64 { return 0 }}}
	m.Instrument(tr)

	req, _ := http.NewRequest("GET", "http://orders.test/", nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		fmt.Println(err)
		return
	}
	resp.Body.Close()

	var rm metricdata.ResourceMetrics
	reader.Collect(context.Background(), &rm)
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			switch d := mt.Data.(type) {
			case metricdata.Sum[int64]:
				total := int64(0)
				for _, dp := range d.DataPoints {
					total += dp.Value
				}
				fmt.Println(mt.Name, total)
			case metricdata.Gauge[int64]:
				fmt.Println(mt.Name, d.DataPoints[0].Value)
			}
		}
	}
	// Unordered output:
	// retryhttp.attempts 3
	// retryhttp.requests 1
	// retryhttp.retries 2
	// retryhttp.budget.tokens 486
	// retryhttp.budget.fallback 0
}
