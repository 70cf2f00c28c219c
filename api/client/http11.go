package client

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/mpsd/mpsd/api"
)

// The HTTP/1.1 subset mpsd's API needs (RFC 9112): one request per
// connection ("Connection: close"), its body with Content-Length; an
// answer whose body has a Content-Length, is chunked (the lease stream,
// as net/http's server sends a body of unknown length), or lasts until
// the close. Everything read is bounded.

// Bounds of what is read before the body.
const (
	maxHeaderBytes = 64 << 10
	maxHeaderLines = 100
	maxChunkLine   = 4 << 10
)

var (
	// errMalformed is wrapped by an answer whose status line or headers
	// are not HTTP/1.x.
	errMalformed = errors.New("malformed HTTP answer")
	// errChunked is wrapped by a chunked body that breaks the encoding.
	errChunked = errors.New("malformed chunked body")
)

// encodeRequest is the request's bytes: the line, the headers, the body.
func encodeRequest(method, path, accept string, body []byte) []byte {
	var b strings.Builder
	b.Grow(160 + len(body))
	b.WriteString(method + " " + path + " HTTP/1.1\r\nHost: mpsd\r\nConnection: close\r\nUser-Agent: mpsd-client\r\n")
	if accept != "" {
		b.WriteString("Accept: " + accept + "\r\n")
	}
	if body != nil || method == "POST" {
		b.WriteString("Content-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n")
	}
	b.WriteString("\r\n")
	b.Write(body)
	return []byte(b.String())
}

// The api headers as the header switch compares them.
var (
	leaseIDHeader  = strings.ToLower(api.HeaderLeaseID)
	versionHeader  = strings.ToLower(api.HeaderVersion)
	apiLevelHeader = strings.ToLower(api.HeaderAPILevel)
)

// response is an answer's status, the headers the client uses, and its
// body, decoded from its framing.
type response struct {
	status      int
	contentType string
	leaseID     string // api.HeaderLeaseID
	version     string // api.HeaderVersion
	apiLevel    string // api.HeaderAPILevel
	body        io.Reader
}

// readResponse reads an answer's status line and headers from r (1xx
// interim answers skipped) and frames its body. A connection that ends
// before the headers do is io.EOF or io.ErrUnexpectedEOF; a malformed
// answer wraps errMalformed.
func readResponse(r io.Reader) (*response, error) {
	br := bufio.NewReaderSize(r, 4096)
	budget := maxHeaderBytes
	for {
		line, err := readLine(br, &budget)
		if err != nil {
			return nil, err
		}
		status, err := parseStatusLine(line)
		if err != nil {
			return nil, err
		}
		resp := &response{status: status}
		var (
			length  = int64(-1)
			chunked bool
		)
		for n := 0; ; n++ {
			line, err := readLine(br, &budget)
			if err != nil {
				return nil, noEOF(err)
			}
			if line == "" {
				break
			}
			if n >= maxHeaderLines {
				return nil, fmt.Errorf("%w: more than %d header lines", errMalformed, maxHeaderLines)
			}
			name, value, ok := strings.Cut(line, ":")
			if !ok || name == "" || strings.ContainsAny(name, " \t") {
				return nil, fmt.Errorf("%w: header line %q", errMalformed, clip(line))
			}
			value = strings.Trim(value, " \t")
			switch strings.ToLower(name) {
			case "content-type":
				resp.contentType = value
			case leaseIDHeader:
				resp.leaseID = value
			case versionHeader:
				resp.version = value
			case apiLevelHeader:
				resp.apiLevel = value
			case "content-length":
				v, err := strconv.ParseInt(value, 10, 64)
				if err != nil || v < 0 || (length >= 0 && v != length) {
					return nil, fmt.Errorf("%w: Content-Length %q", errMalformed, clip(value))
				}
				length = v
			case "transfer-encoding":
				if !strings.EqualFold(value, "chunked") {
					return nil, fmt.Errorf("%w: Transfer-Encoding %q", errMalformed, clip(value))
				}
				chunked = true
			}
		}
		if status >= 100 && status < 200 {
			continue // 100 Continue and the like: the answer follows
		}
		switch {
		case chunked:
			resp.body = &chunkedReader{r: br}
		case length >= 0:
			resp.body = &exactReader{r: br, left: length}
		case status == 204 || status == 304:
			resp.body = strings.NewReader("")
		default:
			resp.body = br // until the close
		}
		return resp, nil
	}
}

// parseStatusLine reads "HTTP/1.1 200 OK".
func parseStatusLine(line string) (int, error) {
	proto, rest, ok := strings.Cut(line, " ")
	if !ok || (proto != "HTTP/1.1" && proto != "HTTP/1.0") {
		return 0, fmt.Errorf("%w: status line %q", errMalformed, clip(line))
	}
	code, _, _ := strings.Cut(rest, " ")
	status, err := strconv.Atoi(code)
	if err != nil || len(code) != 3 || status < 100 {
		return 0, fmt.Errorf("%w: status line %q", errMalformed, clip(line))
	}
	return status, nil
}

// readLine reads one CRLF- (or LF-) terminated line, charging it to
// budget.
func readLine(br *bufio.Reader, budget *int) (string, error) {
	var b []byte
	for {
		frag, err := br.ReadSlice('\n')
		*budget -= len(frag)
		if *budget < 0 {
			return "", fmt.Errorf("%w: headers larger than %d bytes", errMalformed, maxHeaderBytes)
		}
		b = append(b, frag...)
		switch {
		case err == nil:
			s := strings.TrimSuffix(string(b[:len(b)-1]), "\r")
			return s, nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF) && len(b) > 0:
			return "", io.ErrUnexpectedEOF
		default:
			return "", err
		}
	}
}

func noEOF(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// clip shortens what an error quotes from the peer.
func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

// exactReader is a body of a known length: it ends there, and a
// connection that ends first is io.ErrUnexpectedEOF.
type exactReader struct {
	r    io.Reader
	left int64
}

func (e *exactReader) Read(p []byte) (int, error) {
	if e.left <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > e.left {
		p = p[:e.left]
	}
	n, err := e.r.Read(p)
	e.left -= int64(n)
	if errors.Is(err, io.EOF) {
		if e.left > 0 {
			return n, io.ErrUnexpectedEOF
		}
		err = nil
	}
	if err == nil && e.left == 0 {
		err = io.EOF
	}
	return n, err
}

// chunkedReader decodes a chunked body (RFC 9112 §7.1): hex size lines
// (extensions ignored), data and CRLF, a zero-size last chunk, trailers
// until an empty line. A connection that ends before the last chunk is
// io.ErrUnexpectedEOF (mpsd killed in the middle of its stream).
type chunkedReader struct {
	r    *bufio.Reader
	left int64 // bytes left in the current chunk
	err  error
}

func (c *chunkedReader) Read(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	if len(p) == 0 {
		return 0, nil
	}
	if c.left == 0 {
		size, err := c.chunkSize()
		if err != nil {
			c.err = err
			return 0, err
		}
		if size == 0 {
			c.err = c.trailers()
			return 0, c.err
		}
		c.left = size
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.r.Read(p)
	c.left -= int64(n)
	if err != nil {
		c.err = noEOF(err)
		return n, c.err
	}
	if c.left == 0 {
		if err := c.crlf(); err != nil {
			c.err = err
			return n, nil // the data is good; the error comes next
		}
	}
	return n, nil
}

func (c *chunkedReader) chunkSize() (int64, error) {
	budget := maxChunkLine
	line, err := readLine(c.r, &budget)
	if err != nil {
		if errors.Is(err, errMalformed) {
			return 0, fmt.Errorf("%w: chunk size line too long", errChunked)
		}
		return 0, noEOF(err)
	}
	hex, _, _ := strings.Cut(line, ";")
	hex = strings.TrimRight(hex, " \t")
	size, err := strconv.ParseInt(hex, 16, 64)
	if err != nil || size < 0 || hex == "" || hex[0] == '+' || hex[0] == '-' {
		return 0, fmt.Errorf("%w: chunk size %q", errChunked, clip(line))
	}
	return size, nil
}

func (c *chunkedReader) crlf() error {
	b, err := c.r.ReadByte()
	if err == nil && b == '\r' {
		b, err = c.r.ReadByte()
	}
	if err != nil {
		return noEOF(err)
	}
	if b != '\n' {
		return fmt.Errorf("%w: no CRLF after a chunk", errChunked)
	}
	return nil
}

func (c *chunkedReader) trailers() error {
	budget := maxHeaderBytes
	for {
		line, err := readLine(c.r, &budget)
		if err != nil {
			if errors.Is(err, errMalformed) {
				return fmt.Errorf("%w: trailers too large", errChunked)
			}
			return noEOF(err)
		}
		if line == "" {
			return io.EOF
		}
	}
}
