package client

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"strconv"
	"strings"
	"testing"
)

// FuzzReadResponse: whatever the peer sends, the answer's parser and its
// body's framing return (bounded), never panic, and a chunked body
// decodes to what a well-formed encoding of it carries.
func FuzzReadResponse(f *testing.F) {
	f.Add([]byte("HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"))
	f.Add([]byte("HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\n{}"))
	f.Add([]byte("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.0 200 OK\r\n\r\nbody until close"))
	f.Add([]byte("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\n"))
	f.Add([]byte("HTTP/1.1 200\r\nContent-Length: -1\r\n\r\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		resp, err := readResponse(bytes.NewReader(b))
		if err != nil {
			return
		}
		if resp.status < 100 || resp.status > 999 {
			t.Fatalf("status %d", resp.status)
		}
		got, err := io.ReadAll(io.LimitReader(resp.body, int64(len(b))+1))
		if err == nil && len(got) > len(b) {
			t.Fatalf("body of %d bytes from %d bytes of input", len(got), len(b))
		}
	})
}

func FuzzChunked(f *testing.F) {
	f.Add([]byte("hello"), uint8(2))
	f.Add([]byte(""), uint8(1))
	f.Fuzz(func(t *testing.T, data []byte, size uint8) {
		n := int(size%16) + 1
		var enc strings.Builder
		for rest := data; len(rest) > 0; {
			k := min(n, len(rest))
			enc.WriteString(strings.ToUpper(strconv.FormatInt(int64(k), 16)) + ";ext=1\r\n")
			enc.Write(rest[:k])
			enc.WriteString("\r\n")
			rest = rest[k:]
		}
		enc.WriteString("0\r\nTrailer: x\r\n\r\n")
		got, err := io.ReadAll(&chunkedReader{r: newBufReader(enc.String())})
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("decoded %q, %v; want %q", got, err, data)
		}
		// Cut anywhere before the end: an unexpected EOF or a framing
		// error, never a clean end.
		s := enc.String()
		for cut := 0; cut < len(s)-2; cut += max(1, len(s)/7) {
			_, err := io.ReadAll(&chunkedReader{r: newBufReader(s[:cut])})
			if err == nil || !(errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, errChunked)) {
				t.Fatalf("cut at %d of %q: %v", cut, s, err)
			}
		}
	})
}

func newBufReader(s string) *bufio.Reader { return bufio.NewReader(strings.NewReader(s)) }
