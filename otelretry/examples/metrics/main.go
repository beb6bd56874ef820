// Command metrics sends a few requests through a Transport instrumented
// with otelretry and prints the metrics an OpenTelemetry reader collects. It
// starts its own local server; no network needed.
//
//	(cd otelretry && go run ./examples/metrics)
package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"sort"
	"sync/atomic"
	"time"

	"github.com/herdproof/retryhttp"
	"github.com/herdproof/retryhttp/otelretry"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

func main() {
	// Two attempts in every five fail with a 503.
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if i := n.Add(1); i%5 == 1 || i%5 == 2 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ok")
	}))
	defer srv.Close()

	reader := sdkmetric.NewManualReader()
	m, err := otelretry.New(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	if err != nil {
		log.Fatal(err)
	}
	tr := &retryhttp.Transport{Policy: retryhttp.Policy{BaseDelay: time.Millisecond}}
	m.Instrument(tr, attribute.String("client", "demo"))
	client := &http.Client{Transport: tr}
	for range 10 {
		resp, err := client.Get(srv.URL)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		log.Fatal(err)
	}
	var lines []string
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			switch d := mt.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range d.DataPoints {
					lines = append(lines, fmt.Sprintf("%s %v = %d", mt.Name, dp.Attributes.ToSlice(), dp.Value))
				}
			case metricdata.Gauge[int64]:
				for _, dp := range d.DataPoints {
					lines = append(lines, fmt.Sprintf("%s %v = %d", mt.Name, dp.Attributes.ToSlice(), dp.Value))
				}
			case metricdata.Histogram[float64]:
				for _, dp := range d.DataPoints {
					lines = append(lines, fmt.Sprintf("%s %v: %d waits, %.3fs in all", mt.Name, dp.Attributes.ToSlice(), dp.Count, dp.Sum))
				}
			}
		}
	}
	sort.Strings(lines)
	for _, l := range lines {
		fmt.Println(l)
	}
}
