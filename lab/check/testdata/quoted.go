package testdata

import "fmt"

// Quoted is quoted by checker_test.go.
func Quoted() {
	fmt.Println("hello")
}
