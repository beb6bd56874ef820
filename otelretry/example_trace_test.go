package otelretry_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"slices"
	"strings"

	"github.com/herdproof/retryhttp"
	"github.com/herdproof/retryhttp/otelretry"
	"github.com/herdproof/retryhttp/retryhttptest"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

func ExampleTrace() {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer tp.Shutdown(context.Background())

	// A dependency that fails twice, then answers; zero waits for the example.
	base := retryhttptest.NewTransport(retryhttptest.Status(503).Times(2), retryhttptest.Status(200))
	tr := &retryhttp.Transport{Base: base, Policy: retryhttp.Policy{Rand: func(int64) int64 { return 0 }}}
	client := &http.Client{Transport: otelretry.Trace(tr, tp, propagation.TraceContext{})}

	resp, err := client.Get("http://orders.test/items?token=secret")
	if err != nil {
		fmt.Println(err)
		return
	}
	resp.Body.Close()

	// Print each span under its parent, with a few of its attributes.
	spans := exp.GetSpans()
	var print func(parent trace.SpanID, depth int)
	print = func(parent trace.SpanID, depth int) {
		for _, s := range spans {
			if s.Parent.SpanID() != parent {
				continue
			}
			line := []string{strings.Repeat("  ", depth) + s.Name, s.SpanKind.String()}
			for _, kv := range s.Attributes {
				switch kv.Key {
				case "url.full", "http.request.resend_count", "http.response.status_code", "retryhttp.decision":
					line = append(line, string(kv.Key)+"="+kv.Value.Emit())
				}
			}
			for _, e := range s.Events {
				for _, kv := range e.Attributes {
					if kv.Key == "retryhttp.delay_source" {
						line = append(line, "["+e.Name+" "+kv.Value.Emit()+"]")
					}
				}
			}
			fmt.Println(strings.Join(line, " "))
			print(s.SpanContext.SpanID(), depth+1)
		}
	}
	slices.SortStableFunc(spans, func(a, b tracetest.SpanStub) int { return a.StartTime.Compare(b.StartTime) })
	print(trace.SpanID{}, 0)
	// Output:
	// retryhttp GET internal url.full=http://orders.test/items retryhttp.decision=done http.response.status_code=200 [retryhttp.wait backoff] [retryhttp.wait backoff]
	//   GET client url.full=http://orders.test/items retryhttp.decision=retry http.response.status_code=503
	//   GET client url.full=http://orders.test/items http.request.resend_count=1 retryhttp.decision=retry http.response.status_code=503
	//   GET client url.full=http://orders.test/items http.request.resend_count=2 retryhttp.decision=done http.response.status_code=200
}

// The recommended setup: otelhttp above the Transport gives the request's
// span, and Trace a span per attempt under it.
func ExampleTrace_otelhttp() {
	otel.SetTextMapPropagator(propagation.TraceContext{}) // once, in main
	tr := &retryhttp.Transport{}
	traced := otelretry.Trace(tr, otel.GetTracerProvider(), otel.GetTextMapPropagator())
	client := &http.Client{Transport: otelhttp.NewTransport(traced)}

	resp, err := client.Get("https://orders.example/items")
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
}
