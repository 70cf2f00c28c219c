package api

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// DecodeLeaseRequest reads one LeaseRequest from r strictly: at most
// MaxRequestBytes, one JSON object, no unknown fields, nothing after it,
// and Validate passes. Errors wrap ErrTooLarge or ErrInvalid.
func DecodeLeaseRequest(r io.Reader) (LeaseRequest, error) {
	var req LeaseRequest
	if err := decodeStrict(r, MaxRequestBytes, "lease request", &req); err != nil {
		return LeaseRequest{}, err
	}
	if err := req.Validate(); err != nil {
		return LeaseRequest{}, err
	}
	return req, nil
}

// DecodeAttachRequest reads one AttachRequest from r as strictly as
// DecodeLeaseRequest.
func DecodeAttachRequest(r io.Reader) (AttachRequest, error) {
	var req AttachRequest
	if err := decodeStrict(r, MaxRequestBytes, "attach request", &req); err != nil {
		return AttachRequest{}, err
	}
	if err := req.Validate(); err != nil {
		return AttachRequest{}, err
	}
	return req, nil
}

// DecodeAdminTarget reads one AdminTarget from r as strictly as
// DecodeLeaseRequest.
func DecodeAdminTarget(r io.Reader) (AdminTarget, error) {
	var t AdminTarget
	if err := decodeStrict(r, MaxRequestBytes, "admin request", &t); err != nil {
		return AdminTarget{}, err
	}
	if err := t.Validate(); err != nil {
		return AdminTarget{}, err
	}
	return t, nil
}

// DecodeRequeueRequest reads one RequeueRequest from r as strictly as
// DecodeLeaseRequest.
func DecodeRequeueRequest(r io.Reader) (RequeueRequest, error) {
	var q RequeueRequest
	if err := decodeStrict(r, MaxRequestBytes, "requeue request", &q); err != nil {
		return RequeueRequest{}, err
	}
	if err := q.Validate(); err != nil {
		return RequeueRequest{}, err
	}
	return q, nil
}

// DecodeInjectXidRequest reads one InjectXidRequest from r as strictly as
// DecodeLeaseRequest.
func DecodeInjectXidRequest(r io.Reader) (InjectXidRequest, error) {
	var q InjectXidRequest
	if err := decodeStrict(r, MaxRequestBytes, "inject-xid request", &q); err != nil {
		return InjectXidRequest{}, err
	}
	if err := q.Validate(); err != nil {
		return InjectXidRequest{}, err
	}
	return q, nil
}

// DecodeError reads the Error body of a non-2xx response. A body that is
// not an Error (a proxy's page, an empty body) still yields an Error, with
// CodeInternal and the HTTP status in the message, because the caller
// wants to report something useful either way.
func DecodeError(status int, r io.Reader) *Error {
	body, _ := io.ReadAll(io.LimitReader(r, MaxEventBytes))
	var e Error
	if err := json.Unmarshal(body, &e); err != nil || e.Message == "" {
		return &Error{Code: CodeInternal, Message: strings.TrimSpace("mpsd answered " + strconv.Itoa(status) + " " + statusText[status])}
	}
	if e.Code == "" {
		e.Code = CodeInternal
	}
	return &e
}

func decodeStrict(r io.Reader, limit int64, what string, v any) error {
	return decodeObject(r, limit, what, v, true)
}

// decodeObject is decodeStrict; with strict false, fields v does not know
// are ignored (an answer of a later mpsd, as the package doc says).
func decodeObject(r io.Reader, limit int64, what string, v any, strict bool) error {
	body, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return fmt.Errorf("api: read %s: %w", what, err)
	}
	if int64(len(body)) > limit {
		return fmt.Errorf("%w: %s is more than %d bytes", ErrTooLarge, what, limit)
	}
	if kind := jsonKind(body); kind != "an object" {
		// json.Decoder takes null for an object and leaves v at its zero
		// value: an empty request that was never sent as one.
		return fmt.Errorf("%w: %s must be a JSON object, got %s", ErrInvalid, what, kind)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if strict {
		dec.DisallowUnknownFields()
	}
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrInvalid, what, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return fmt.Errorf("%w: %s: data after the JSON object", ErrInvalid, what)
	}
	return nil
}

// jsonKind names the kind of JSON value body starts with, for the
// message that refuses anything but an object.
func jsonKind(body []byte) string {
	b := bytes.TrimLeft(body, " \t\r\n")
	if len(b) == 0 {
		return "an empty body"
	}
	switch c := b[0]; {
	case c == '{':
		return "an object"
	case c == '[':
		return "an array"
	case c == '"':
		return "a string"
	case c == 'n':
		return "null"
	case c == 't' || c == 'f':
		return "a boolean"
	case c == '-' || (c >= '0' && c <= '9'):
		return "a number"
	}
	return "something that is not JSON"
}

// EventDecoder reads the NDJSON lease stream.
type EventDecoder struct {
	r *bufio.Reader
}

// NewEventDecoder reads events from r.
func NewEventDecoder(r io.Reader) *EventDecoder {
	return &EventDecoder{r: bufio.NewReaderSize(r, 4096)}
}

// Next returns the next event. Blank lines are skipped; unknown fields are
// ignored (see the package doc); the event must pass Validate.
//
// Results: (event, nil); (zero, io.EOF) when the stream ends cleanly
// between lines; (zero, io.ErrUnexpectedEOF) when it ends inside a line;
// (zero, error wrapping ErrInvalid or ErrTooLarge) for a bad line, after
// which the stream cannot be trusted; (zero, the reader's error) otherwise.
func (d *EventDecoder) Next() (Event, error) {
	for {
		line, err := d.readLine()
		if err != nil {
			return Event{}, err
		}
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		return ParseEvent(line)
	}
}

// readLine returns one line without its newline, at most MaxEventBytes.
func (d *EventDecoder) readLine() ([]byte, error) {
	var line []byte
	for {
		frag, err := d.r.ReadSlice('\n')
		if len(line)+len(frag) > MaxEventBytes+1 {
			return nil, fmt.Errorf("%w: event line longer than %d bytes", ErrTooLarge, MaxEventBytes)
		}
		switch {
		case err == nil:
			return append(line, frag[:len(frag)-1]...), nil
		case errors.Is(err, bufio.ErrBufferFull):
			line = append(line, frag...)
		case errors.Is(err, io.EOF):
			if len(line)+len(frag) == 0 {
				return nil, io.EOF
			}
			return nil, fmt.Errorf("api: event stream ended inside a line: %w", io.ErrUnexpectedEOF)
		default:
			return nil, fmt.Errorf("api: read event stream: %w", err)
		}
	}
}

// ParseEvent decodes one event line (without its newline) and validates
// it. Errors wrap ErrInvalid.
func ParseEvent(line []byte) (Event, error) {
	var ev Event
	dec := json.NewDecoder(bytes.NewReader(line))
	if err := dec.Decode(&ev); err != nil {
		return Event{}, fmt.Errorf("%w: event: %w", ErrInvalid, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return Event{}, fmt.Errorf("%w: event: data after the JSON object", ErrInvalid)
	}
	if err := ev.Validate(); err != nil {
		return Event{}, err
	}
	return ev, nil
}

// statusText names the HTTP statuses a proxy or a broken mpsd may answer
// with, for DecodeError's message (package api does not link net/http:
// mps-launch starts faster without it).
var statusText = map[int]string{
	400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
	405: "Method Not Allowed", 408: "Request Timeout", 409: "Conflict", 413: "Request Entity Too Large",
	429: "Too Many Requests", 500: "Internal Server Error", 501: "Not Implemented",
	502: "Bad Gateway", 503: "Service Unavailable", 504: "Gateway Timeout",
}

// flusher is net/http's Flusher, named here without linking net/http.
type flusher interface{ Flush() }

// WriteEvent validates ev and writes it as one line to w, then flushes w
// if it is an http.Flusher, so the client sees each event as it happens.
func WriteEvent(w io.Writer, ev Event) error {
	if err := ev.Validate(); err != nil {
		return err
	}
	line, err := json.Marshal(ev)
	if err != nil {
		return fmt.Errorf("api: encode %s event: %w", ev.Type, err)
	}
	if len(line) > MaxEventBytes {
		return fmt.Errorf("%w: %s event is %d bytes", ErrTooLarge, ev.Type, len(line))
	}
	if _, err := w.Write(append(line, '\n')); err != nil {
		return fmt.Errorf("api: write %s event: %w", ev.Type, err)
	}
	if f, ok := w.(flusher); ok {
		f.Flush()
	}
	return nil
}

// DecodeReleaseRequest reads one ReleaseRequest from r as strictly as
// DecodeLeaseRequest.
func DecodeReleaseRequest(r io.Reader) (ReleaseRequest, error) {
	var q ReleaseRequest
	if err := decodeStrict(r, MaxRequestBytes, "release request", &q); err != nil {
		return ReleaseRequest{}, err
	}
	if err := q.Validate(); err != nil {
		return ReleaseRequest{}, err
	}
	return q, nil
}

// DecodeShutdownRequest reads one ShutdownRequest (an empty object) from r
// as strictly as DecodeLeaseRequest.
func DecodeShutdownRequest(r io.Reader) (ShutdownRequest, error) {
	var q ShutdownRequest
	if err := decodeStrict(r, MaxRequestBytes, "request", &q); err != nil {
		return ShutdownRequest{}, err
	}
	return q, nil
}
