package mpsd

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/mpsd/mpsd/policy"
)

// A config's problems are one record each, and what is left for the
// caller's record is one line; a reload's failure logs them so too.
func TestLogConfigProblems(t *testing.T) {
	several := fmt.Errorf("%w: %w", ErrConfig, &policy.ConfigError{Path: "/etc/mpsd/mpsd.yaml", Problems: []policy.Problem{
		{Key: "groups.a.memory", Message: "required"},
		{Key: "socket", Message: `"x" is not an absolute path`},
	}})
	for _, tc := range []struct {
		name     string
		err      error
		summary  string
		problems int
		records  []string
	}{
		{"several", several, "mpsd: invalid config: policy: invalid config /etc/mpsd/mpsd.yaml: 2 problems", 2, []string{
			`level=ERROR msg="config problem" config=/etc/mpsd/mpsd.yaml key=groups.a.memory problem=required`,
			`level=ERROR msg="config problem" config=/etc/mpsd/mpsd.yaml key=socket problem="\"x\" is not an absolute path"`,
		}},
		{"one", &policy.ConfigError{Problems: []policy.Problem{{Key: "version", Message: "required"}}},
			"policy: invalid config: version: required", 1, []string{
				`level=ERROR msg="config problem" config="" key=version problem=required`,
			}},
		{"no config error", errors.New("read a\nb"), "read a; b", 0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
				if a.Key == slog.TimeKey {
					return slog.Attr{}
				}
				return a
			}}))
			summary, n := LogConfigProblems(log, tc.err)
			if summary != tc.summary || n != tc.problems {
				t.Errorf("LogConfigProblems = %q, %d; want %q, %d", summary, n, tc.summary, tc.problems)
			}
			var got []string
			if s := strings.TrimSuffix(buf.String(), "\n"); s != "" {
				got = strings.Split(s, "\n")
			}
			if strings.Join(got, "\n") != strings.Join(tc.records, "\n") {
				t.Errorf("records:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tc.records, "\n"))
			}
		})
	}
}
