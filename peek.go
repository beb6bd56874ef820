package retryhttp

import (
	"bytes"
	"io"
	"net/http"
)

// PeekBody returns up to n bytes from the start of resp's body and puts
// them back. Whoever reads the body next sees it whole. It is for
// classifiers that must look inside an error body, such as AWS's 400
// ThrottlingException. A read error is returned with what was read, which
// is put back too.
func PeekBody(resp *http.Response, n int) ([]byte, error) {
	if resp == nil || resp.Body == nil || resp.Body == http.NoBody || n <= 0 {
		return nil, nil
	}
	// A buffer that grows with what comes, not one of n bytes: n may be
	// far larger than the body.
	var b bytes.Buffer
	_, err := b.ReadFrom(io.LimitReader(resp.Body, int64(n)))
	if err == io.ErrUnexpectedEOF { // a body cut short: the bytes read are put back all the same
		err = nil
	}
	buf := b.Bytes()
	resp.Body = &peekedBody{Reader: io.MultiReader(bytes.NewReader(buf), resp.Body), Closer: resp.Body}
	return buf, err
}

// peekedBody is a body with its first bytes read and put back.
type peekedBody struct {
	io.Reader
	io.Closer
}
