package testrun

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"strings"
)

// Skip is a test that skipped, and why (its t.Skip message).
type Skip struct {
	Package, Test, Reason string
}

func (s Skip) String() string { return s.Package + " " + s.Test + ": " + s.Reason }

// event is a line of go test -json (cmd/test2json).
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
}

// Report reads go test -json from r and writes to w what a go test without
// -json shows: package results, build errors, the output of failed tests
// (of every test with verbose). It returns the tests that skipped, in the
// order they ended; a skip is what go test alone hides unless verbose.
func Report(r io.Reader, w io.Writer, verbose bool) ([]Skip, error) {
	type key struct{ pkg, test string }
	buf := map[key]*strings.Builder{}
	var order []key // of buf's keys, to flush a package's unfinished tests in order
	var skips []Skip
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			fmt.Fprintf(w, "%s\n", line) // not an event: go's own words
			continue
		}
		k := key{e.Package, e.Test}
		switch {
		case e.Action == "build-output":
			io.WriteString(w, e.Output)
		case e.Test == "" && e.Action == "output":
			if verbose || e.Output != "PASS\n" {
				io.WriteString(w, e.Output)
			}
		case e.Test == "" && (e.Action == "pass" || e.Action == "fail" || e.Action == "skip"):
			// The package ended: a test still open there (a timeout's
			// panic, a crash) failed with it.
			for _, o := range order {
				if b := buf[o]; o.pkg == e.Package && b != nil {
					if e.Action == "fail" && !verbose {
						io.WriteString(w, plain(b.String()))
					}
					delete(buf, o)
				}
			}
		case e.Action == "output":
			if verbose {
				io.WriteString(w, e.Output)
			}
			b := buf[k]
			if b == nil {
				b = &strings.Builder{}
				buf[k] = b
				order = append(order, k)
			}
			b.WriteString(e.Output)
		case e.Action == "fail":
			if b := buf[k]; b != nil && !verbose {
				io.WriteString(w, plain(b.String()))
			}
			delete(buf, k)
		case e.Action == "skip":
			var out string
			if b := buf[k]; b != nil {
				out = b.String()
			}
			skips = append(skips, Skip{Package: e.Package, Test: e.Test, Reason: skipReason(out)})
			delete(buf, k)
		case e.Action == "pass":
			delete(buf, k)
		}
	}
	return skips, sc.Err()
}

// plain drops the framing lines only verbose output has.
func plain(out string) string {
	var b strings.Builder
	for _, l := range strings.SplitAfter(out, "\n") {
		if !strings.HasPrefix(l, "=== ") {
			b.WriteString(l)
		}
	}
	return b.String()
}

// skipReason is a skipped test's message: its output less the framing
// lines, the file:line prefixes and the indentation, one line.
func skipReason(out string) string {
	var parts []string
	for _, l := range strings.Split(out, "\n") {
		t := strings.TrimSpace(l)
		if t == "" || strings.HasPrefix(t, "=== ") || strings.HasPrefix(t, "--- SKIP") {
			continue
		}
		parts = append(parts, fileLine.ReplaceAllString(t, ""))
	}
	if len(parts) == 0 {
		return "(no reason given)"
	}
	return strings.Join(parts, " ")
}

var fileLine = regexp.MustCompile(`^[\w.-]+\.go:\d+: `)

// Allowed are the skips a run may have: one regular expression a line,
// matched against Skip.String (blank lines and # comments left out).
type Allowed []*regexp.Regexp

// ParseAllowed reads an allow-list.
func ParseAllowed(text string) (Allowed, error) {
	var a Allowed
	for i, l := range strings.Split(text, "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		re, err := regexp.Compile(l)
		if err != nil {
			return nil, fmt.Errorf("testrun: allowed skips, line %d: %w", i+1, err)
		}
		a = append(a, re)
	}
	return a, nil
}

// Disallowed lists the skips no pattern allows.
func (a Allowed) Disallowed(skips []Skip) []Skip {
	var out []Skip
	for _, s := range skips {
		ok := false
		for _, re := range a {
			if re.MatchString(s.String()) {
				ok = true
				break
			}
		}
		if !ok {
			out = append(out, s)
		}
	}
	return out
}
