package apicount

// Test files are not counted.
func Exported() {}
