package mpsctl

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/mpsd/mpsd/api"
	"github.com/mpsd/mpsd/api/apitest"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// golden compares got with testdata/name, or rewrites the file with -update.
func golden(t *testing.T, name string, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("output differs from %s (go test -update rewrites it)\ngot:\n%s\nwant:\n%s", path, got, want)
	}
}

// reply is one canned answer of the fake mpsd.
type reply struct {
	status int
	// body is written as it is; contentType defaults to JSON.
	body        string
	contentType string
}

// request is what the fake mpsd received.
type request struct {
	method, path, contentType, body string
}

// fakeMPSD is package apitest's fake mpsd serving canned replies, keyed
// "METHOD PATH", and recording the requests.
type fakeMPSD struct {
	socket string
	srv    *apitest.Server
}

func newFake(t *testing.T, replies map[string]reply) *fakeMPSD {
	t.Helper()
	srv := apitest.New(t, nil)
	// An mpsd of this build: it serves every command (a test of an older
	// one says so with Serves).
	srv.Serves(strconv.Itoa(api.APILevel), "v0.0.0-test")
	for key, rep := range replies {
		method, path, _ := strings.Cut(key, " ")
		srv.Answer(method, path, apitest.Answer{Status: rep.status, Body: rep.body, ContentType: rep.contentType})
	}
	return &fakeMPSD{socket: srv.Socket, srv: srv}
}

func (f *fakeMPSD) requests() []request {
	var reqs []request
	for _, r := range f.srv.Requests() {
		reqs = append(reqs, request{r.Method, r.Path, r.ContentType, r.Body})
	}
	return reqs
}

// ok answers 200 with v as JSON.
func ok(t *testing.T, v any) reply {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return reply{status: http.StatusOK, body: string(b) + "\n"}
}

// fail answers status with an api.Error body.
func fail(t *testing.T, status int, code api.ErrorCode, msg string) reply {
	t.Helper()
	return ok(t, api.Error{Code: code, Message: msg}).withStatus(status)
}

func (r reply) withStatus(s int) reply { r.status = s; return r }

// result is one mpsctl run.
type result struct {
	code           int
	stdout, stderr string
}

// mpsctl runs mpsctl with args and environ in process.
func mpsctl(t *testing.T, cfg Config, environ []string, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	cfg.Stdout, cfg.Stderr = &out, &errb
	cfg.Getenv = func(k string) string {
		for _, kv := range environ {
			if name, v, ok := strings.Cut(kv, "="); ok && name == k {
				return v
			}
		}
		return ""
	}
	code := Run(context.Background(), cfg, args)
	return result{code, out.String(), errb.String()}
}

// firstLine is s's first line.
func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}
