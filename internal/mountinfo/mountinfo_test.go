package mountinfo

import "testing"

func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{
		`/tmp/a`:              "/tmp/a",
		`/tmp/a\040b`:         "/tmp/a b",
		`/x\011y\012z\134w`:   "/x\ty\nz\\w",
		`/trailing\04`:        `/trailing\04`,
		`/not\999octal\040ok`: `/not\999octal ok`,
	} {
		if got := Unescape(in); got != want {
			t.Errorf("Unescape(%q) = %q, want %q", in, got, want)
		}
	}
}

func FuzzUnescape(f *testing.F) {
	f.Add(`/a\040b\134`)
	f.Fuzz(func(t *testing.T, s string) {
		if out := Unescape(s); len(out) > len(s) {
			t.Fatalf("Unescape(%q) = %q grew", s, out)
		}
	})
}
