package mpsctl

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

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
		if err := WriteStatus(&b, st); err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
		sections := []struct {
			title string
			rows  int
			cols  int
		}{
			{"INSTANCES", len(st.Instances), 10},
			{"LEASES", len(st.Leases), 10},
			{"QUEUE", len(st.Queue), 2},
		}
		i := 0
		for n, s := range sections {
			if n > 0 {
				if i >= len(lines) || lines[i] != "" {
					t.Fatalf("no blank line before %s:\n%s", s.title, b.String())
				}
				i++
			}
			if i >= len(lines) || lines[i] != s.title {
				t.Fatalf("no %s title at line %d:\n%s", s.title, i, b.String())
			}
			i++
			if s.rows == 0 {
				if i >= len(lines) || lines[i] != "  (none)" {
					t.Fatalf("empty %s not marked:\n%s", s.title, b.String())
				}
				i++
				continue
			}
			for r := 0; r <= s.rows; r++ { // the header, then the rows
				if i >= len(lines) {
					t.Fatalf("%s: %d rows; want %d:\n%s", s.title, r-1, s.rows, b.String())
				}
				if got := len(strings.Fields(lines[i])); got != s.cols {
					t.Fatalf("%s line %q has %d cells; want %d", s.title, lines[i], got, s.cols)
				}
				i++
			}
		}
		if i != len(lines) {
			t.Fatalf("%d lines; want %d:\n%s", len(lines), i, b.String())
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
