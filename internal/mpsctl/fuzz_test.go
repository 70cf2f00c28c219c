package mpsctl

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode"

	"github.com/mpsd/mpsd/api"
)

// FuzzStatus feeds status documents as mpsd might send them (mpsctl
// trusts mpsd's JSON no more than any input): whatever a document holds,
// the table keeps its layout, one row per entry with every cell one word,
// and --json prints the same JSON value.
func FuzzStatus(f *testing.F) {
	fixture, _ := json.Marshal(statusFixture())
	for _, seed := range []string{
		string(fixture),
		`{}`,
		`{"instances":null,"leases":null,"queue":null}`,
		`{"instances":[{"group":"a b","state":"\n","gpu_uuid":"GPU-\u2028x","gpu_uuids":["",""],"gpu_indexes":[-1,2]}],"queue":{"":3,"x y":-1}}`,
		`{"leases":[{"id":"\t","pids":[0,-5],"mem_bytes":-9223372036854775808,"job_id":" \u0085 "}],"future":[1]}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var st api.Status
		if json.Unmarshal(raw, &st) != nil {
			return
		}
		var b bytes.Buffer
		if err := WriteStatus(&b, st, func(uint32) string { return "" }); err != nil {
			t.Fatal(err)
		}
		out := b.String()
		if strings.ContainsFunc(out, func(r rune) bool { return r != '\n' && unicode.IsControl(r) }) {
			t.Fatalf("control characters in the table:\n%q", out)
		}
		lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
		if !strings.HasPrefix(lines[0], "instances: ") || len(lines) < 2 || lines[1] != "" {
			t.Fatalf("no summary line first:\n%s", out)
		}
		var running, queued int
		for _, l := range st.Leases {
			if l.State == api.LeaseRunning {
				running++
			} else {
				queued++
			}
		}
		// Every cell is one word but the last (a note, a command), which
		// may hold blanks: a row has at least cols fields.
		sections := []struct {
			title string
			rows  int
			cols  int
			own   bool
		}{
			{"INSTANCES", len(st.Instances), 12, false},
			{"RUNNING", running, 15, st.OwnOnly},
			{"QUEUED", queued, 12, st.OwnOnly},
		}
		if st.OwnOnly && len(st.Queue) > 0 {
			sections = append(sections, struct {
				title string
				rows  int
				cols  int
				own   bool
			}{"QUEUE (everyone's)", len(st.Queue), 3, false})
		}
		i := 2
		for n, s := range sections {
			if n > 0 {
				if i >= len(lines) || lines[i] != "" {
					t.Fatalf("no blank line before %s:\n%s", s.title, out)
				}
				i++
			}
			if i >= len(lines) || lines[i] != s.title {
				t.Fatalf("no %s title at line %d:\n%s", s.title, i, out)
			}
			i++
			if s.own {
				i++ // "(yours only ...)"
			}
			if s.rows == 0 {
				if i >= len(lines) || lines[i] != "  (none)" {
					t.Fatalf("empty %s not marked:\n%s", s.title, out)
				}
				i++
				continue
			}
			for r := 0; r <= s.rows; r++ { // the header, then the rows
				if i >= len(lines) {
					t.Fatalf("%s: %d rows; want %d:\n%s", s.title, r-1, s.rows, out)
				}
				if got := len(strings.Fields(lines[i])); got < s.cols || (r == 0 && got != s.cols) {
					t.Fatalf("%s line %q has %d cells; want %d", s.title, lines[i], got, s.cols)
				}
				i++
			}
			if s.title == "QUEUED" || s.title == "RUNNING" || s.title == "INSTANCES" {
				for i < len(lines) && strings.HasPrefix(lines[i], "  ") { // the wait reasons, the leases over their procs, the shared groups and MPS versions
					i++
				}
			}
		}
		if i != len(lines) {
			t.Fatalf("%d lines; want %d:\n%s", len(lines), i, out)
		}

		// The wide view and the rows alone keep to one line per row too.
		for _, v := range []StatusView{{Wide: true}, {NoHeaders: true}} {
			var w bytes.Buffer
			if err := WriteStatusView(&w, st, nil, v); err != nil {
				t.Fatal(err)
			}
			if strings.ContainsFunc(w.String(), func(r rune) bool { return r != '\n' && unicode.IsControl(r) }) {
				t.Fatalf("control characters in the table %+v:\n%q", v, w.String())
			}
		}
		// A filter's JSON of a document mpsd might send is JSON, holding
		// what the filter keeps.
		var k kept
		for i := range st.Instances {
			if i%2 == 0 {
				k.instances = append(k.instances, i)
			}
		}
		for i := range st.Leases {
			if i%2 == 1 {
				k.leases = append(k.leases, i)
			}
		}
		fj, err := k.filterJSON(raw, "g")
		if err != nil {
			t.Fatalf("filterJSON: %v", err)
		}
		if !json.Valid(fj) {
			t.Fatalf("filterJSON made no JSON of %s: %s", raw, fj)
		}

		var j bytes.Buffer
		if err := WriteStatusJSON(&j, raw); err != nil {
			t.Fatalf("WriteStatusJSON: %v", err)
		}
		var want, got bytes.Buffer
		if err := json.Compact(&want, raw); err != nil {
			t.Fatal(err)
		}
		if err := json.Compact(&got, j.Bytes()); err != nil {
			t.Fatalf("--json output is not JSON: %v", err)
		}
		if got.String() != want.String() {
			t.Fatalf("--json changed the document:\n%s\nwant\n%s", got.String(), want.String())
		}
	})
}
