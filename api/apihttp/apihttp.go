// Package apihttp is the server side of package api over net/http:
// what mpsd (and the fake mpsd of package apitest) write on a
// non-stream answer. It lives apart from package api so that clients,
// mps-launch first, do not link net/http.
package apihttp

import (
	"encoding/json"
	"net/http"

	"github.com/mpsd/mpsd/api"
)

// WriteError answers a non-stream request with status and an api.Error
// body.
func WriteError(w http.ResponseWriter, status int, code api.ErrorCode, message string) {
	body, _ := json.Marshal(api.Error{Code: code, Message: message})
	w.Header().Set("Content-Type", api.ContentTypeJSON)
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}
