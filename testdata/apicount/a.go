// Package apicount is a fixture for api_test.go's counter.
package apicount

// C, V, F, T and I are counted; the lower-case names are not.
const C, c = 1, 2

var V, v = 1, 2

func F() {}
func f() {}

type T struct {
	Field  int
	field  int
	Hidden hidden // counted: an exported field
}

func (T) Method()  {}
func (T) method()  {}
func (hidden) M2() {} // a method of an unexported type

type hidden struct{ X int }

type I interface {
	M()
	m()
}
