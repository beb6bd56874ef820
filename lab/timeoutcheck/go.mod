module github.com/herdproof/retryhttp/lab/timeoutcheck

go 1.25

require github.com/herdproof/retryhttp v0.0.0

require github.com/hashicorp/go-cleanhttp v0.5.2 // indirect

replace github.com/herdproof/retryhttp => ../../
