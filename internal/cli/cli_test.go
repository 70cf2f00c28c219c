package cli

import (
	"errors"
	"flag"
	"io"
	"testing"
)

func TestDistance(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want int
	}{
		{"", "", 0},
		{"drain", "drain", 0},
		{"drian", "drain", 1}, // a swap
		{"dran", "drain", 1},
		{"status", "stat", 2},
		{"", "json", 4},
		{"kitten", "sitting", 3},
		{"gpü", "gpu", 1}, // characters, not bytes
	} {
		if got := Distance(tc.a, tc.b); got != tc.want {
			t.Errorf("Distance(%q, %q) = %d; want %d", tc.a, tc.b, got, tc.want)
		}
		if got := Distance(tc.b, tc.a); got != tc.want {
			t.Errorf("Distance(%q, %q) = %d; want %d", tc.b, tc.a, got, tc.want)
		}
	}
}

func TestSuggest(t *testing.T) {
	cmds := []string{"status", "drain", "resume", "restart", "requeue", "shutdown", "inject-xid", "check-config"}
	for _, tc := range []struct {
		name, got string
		want      string
	}{
		{"swap", "drian", "drain"},
		{"missing letter", "statu", "status"},
		{"unique prefix", "sh", "shutdown"},
		{"ambiguous prefix", "re", ""},
		{"far", "frobnicate", ""},
		{"short and far", "x", ""},
		{"exact", "resume", "resume"},
		{"empty", "", ""},
		{"tie", "restar", "restart"}, // a prefix of one only
	} {
		if got := Suggest(tc.got, cmds); got != tc.want {
			t.Errorf("%s: Suggest(%q) = %q; want %q", tc.name, tc.got, got, tc.want)
		}
	}
	if got := Suggest("ab", []string{"ac", "ad"}); got != "" {
		t.Errorf("two names one edit away: Suggest = %q; want none", got)
	}
}

func TestMessages(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Bool("json", false, "")
	fs.String("group", "", "")
	fs.Int("sm", 0, "")
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown, near", []string{"--jsno"}, "unknown flag --jsno; did you mean --json?"},
		{"unknown, near, with value", []string{"--grop=a"}, "unknown flag --grop; did you mean --group?"},
		{"unknown, far", []string{"--frob"}, "unknown flag --frob"},
		{"needs an argument", []string{"--group"}, "flag --group needs an argument"},
		{"bad value", []string{"--sm", "x"}, `invalid value "x" for flag --sm: parse error`},
	} {
		err := fs.Parse(tc.args)
		if err == nil {
			t.Fatalf("%s: parsed", tc.name)
		}
		if got := FlagError(err, fs); got != tc.want {
			t.Errorf("%s: %q; want %q", tc.name, got, tc.want)
		}
	}
	if got, want := UnknownCommand("drian", []string{"drain", "resume"}), `unknown command "drian"; did you mean "drain"?`; got != want {
		t.Errorf("UnknownCommand = %q; want %q", got, want)
	}
	if got, want := UnknownCommand("frob", []string{"drain"}), `unknown command "frob"`; got != want {
		t.Errorf("UnknownCommand = %q; want %q", got, want)
	}
	if !IsUnknown(UnknownFlag("--x", nil)) || !IsUnknown(UnknownCommand("x", nil)) || IsUnknown(FlagError(errors.New("flag needs an argument: -group"), fs)) {
		t.Error("IsUnknown misjudges")
	}
}

// optional is a flag whose value is optional, as mpsctl status --watch.
type optional struct{ v string }

func (o *optional) String() string     { return o.v }
func (o *optional) Set(s string) error { o.v = s; return nil }
func (o *optional) IsBoolFlag() bool   { return true }

func TestFlagTable(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.Bool("json", false, "print JSON")
	fs.String("group", "", "show only group `G`")
	fs.Var(&optional{}, "watch", "redraw every `INTERVAL`")
	want := "Flags:\n" +
		"  --group G           show only group G\n" +
		"  --json              print JSON\n" +
		"  --watch [INTERVAL]  redraw every INTERVAL\n"
	if got := FlagTable(fs); got != want {
		t.Errorf("FlagTable:\n%s\nwant:\n%s", got, want)
	}
	if got := FlagTable(flag.NewFlagSet("y", flag.ContinueOnError)); got != "" {
		t.Errorf("no flags: %q", got)
	}
}
