package apihttp

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/mpsd/mpsd/api"
)

func TestWriteError(t *testing.T) {
	rec := httptest.NewRecorder()
	WriteError(rec, http.StatusForbidden, api.CodeForbidden, "pid 9 is not your child")
	if rec.Code != http.StatusForbidden || rec.Header().Get("Content-Type") != api.ContentTypeJSON {
		t.Errorf("status %d, content type %q", rec.Code, rec.Header().Get("Content-Type"))
	}
	got := api.DecodeError(rec.Code, rec.Body)
	if got.Code != api.CodeForbidden || got.Message != "pid 9 is not your child" {
		t.Errorf("round trip = %+v", got)
	}
}
