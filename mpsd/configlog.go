package mpsd

import (
	"errors"
	"log/slog"
	"strings"

	"github.com/mpsd/mpsd/policy"
)

// LogConfigProblems logs each problem of the *policy.ConfigError err holds
// as a record of its own at level Error ("config problem", with the file,
// the problem's key path and what is wrong), in key order, as mpsctl
// check-config prints them one a line; a journal shows each on its line,
// where one record holding them all showed them joined by a literal \n.
// It returns the one line the caller's own record of err should carry
// (err's text up to its first line break: "…: 3 problems") and the number
// of problems logged; for an err that holds no ConfigError it logs
// nothing and returns err's text with any line breaks made "; " and 0.
func LogConfigProblems(log *slog.Logger, err error) (summary string, problems int) {
	var ce *policy.ConfigError
	if !errors.As(err, &ce) || len(ce.Problems) == 0 {
		return strings.ReplaceAll(strings.TrimSpace(err.Error()), "\n", "; "), 0
	}
	for _, p := range ce.Problems {
		log.Error("config problem", "config", ce.Path, "key", p.Key, "problem", p.Message)
	}
	summary, _, _ = strings.Cut(err.Error(), "\n")
	return summary, len(ce.Problems)
}
