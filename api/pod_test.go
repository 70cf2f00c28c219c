package api

import (
	"errors"
	"strings"
	"testing"
)

func TestDecodeBindPodRequest(t *testing.T) {
	const id = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	ok := `{"namespace":"tenants","pod":"train-0","container":"cuda","container_id":"` + id + `","pid":4242}`
	for _, tc := range []struct {
		name, body string
		err        error
	}{
		{"ok", ok, nil},
		{"pid 1", strings.Replace(ok, "4242", "1", 1), ErrInvalid},
		{"no pid", strings.Replace(ok, `,"pid":4242`, "", 1), ErrInvalid},
		{"short id", strings.Replace(ok, id, "abc", 1), ErrInvalid},
		{"id with a slash", strings.Replace(ok, id, id[:20]+"/"+id[21:], 1), ErrInvalid},
		{"id too long", strings.Replace(ok, id, strings.Repeat("a", MaxContainerIDLen+1), 1), ErrInvalid},
		{"no namespace", strings.Replace(ok, `"tenants"`, `""`, 1), ErrInvalid},
		{"pod with a slash", strings.Replace(ok, `"train-0"`, `"../x"`, 1), ErrInvalid},
		{"container with a space", strings.Replace(ok, `"cuda"`, `"a b"`, 1), ErrInvalid},
		{"pod too long", strings.Replace(ok, `"train-0"`, `"`+strings.Repeat("p", MaxPodNameLen+1)+`"`, 1), ErrInvalid},
		{"unknown field", strings.Replace(ok, `"pid"`, `"uid":0,"pid"`, 1), ErrInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := DecodeBindPodRequest(strings.NewReader(tc.body))
			if !errors.Is(err, tc.err) || tc.err == nil && err != nil {
				t.Fatalf("err = %v, want %v", err, tc.err)
			}
			if tc.err == nil && (b.PID != 4242 || b.ContainerID != id || b.String() != "pod tenants/train-0 container cuda") {
				t.Errorf("decoded %+v", b)
			}
		})
	}
	if got := PodPath("lease-1"); got != "/v1/leases/lease-1/pod" {
		t.Errorf("PodPath = %q", got)
	}
}
