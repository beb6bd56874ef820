// Package stress holds the goroutine-leak tests of retryhttp. It is a module
// of its own so that go.uber.org/goleak, which they need, stays out of the
// root module's dependencies. Run them from this folder: go test -race ./...
package stress
