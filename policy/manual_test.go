package policy

import (
	"flag"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/mpsd/mpsd/internal/manpage"
	"github.com/mpsd/mpsd/internal/manpage/manpagetest"
)

var update = flag.Bool("update", false, "rewrite the generated files TestManual checks")

// manualRegen is how the file TestManual checks is regenerated.
const manualRegen = "go test ./policy -run TestManual -update"

// TestManual keeps mpsd.yaml(5), committed as docs/man/mpsd.yaml.5, what
// the schema (configFields, groupFields: the keys, their types and
// defaults) and the meanings of docs/config.md's key tables generate. The
// page follows a key added to the schema once docs/config.md documents it
// (TestConfigDocMatchesSchema asks for that).
func TestManual(t *testing.T) {
	rows, _ := readConfigDoc(t)
	page, err := configManual(rows)
	if err != nil {
		t.Fatal(err)
	}
	manpagetest.Check(t, filepath.Join("..", "docs", "man", "mpsd.yaml.5"), manpage.Render(page), *update, manualRegen)
}

// configManual is mpsd.yaml(5): a tagged paragraph per key of the schema,
// in its order, with its type, its default and its meaning from rows.
func configManual(rows map[string]*docRow) (manpage.Page, error) {
	var missing []string
	var top, group []manpage.Block
	for _, f := range configFields {
		b, ok := keyBlock(f.key, f.key, f.def, f.ref(&Config{}), rows)
		if !ok {
			missing = append(missing, f.key)
		}
		top = append(top, b)
	}
	for _, f := range groupFields {
		b, ok := keyBlock(groupDocPrefix+f.key, "groups.NAME."+f.key, f.def, f.ref(&Group{}), rows)
		if !ok {
			missing = append(missing, groupDocPrefix+f.key)
		}
		group = append(group, b)
	}
	if len(missing) > 0 {
		return manpage.Page{}, fmt.Errorf("%s has no meaning for %s (TestConfigDocMatchesSchema says more)", configDoc, strings.Join(missing, ", "))
	}
	return manpage.Page{
		Name: "mpsd.yaml", Section: "5", Source: "mpsd", Manual: "File Formats Manual",
		Summary:  "the configuration file of mpsd",
		Synopsis: []string{"/etc/mpsd/mpsd.yaml"},
		Sections: []manpage.Section{
			{Title: "Description", Blocks: []manpage.Block{
				manpage.Para("mpsd(8) reads one YAML file, /etc/mpsd/mpsd.yaml unless mpsd --config names another: " +
					"schema version 1, whose every key is listed below with its type, its default and what it means. " +
					"Reading is strict: an unknown key, a value of the wrong kind, a missing required key or an " +
					"inconsistent combination is an error naming its key path, every problem of the file is reported " +
					"at once, and mpsd does not start with an invalid file. Keys are case-insensitive; two keys of one " +
					"mapping that differ only in case are an error. mpsctl check-config FILE checks a file as mpsd would load it."),
				manpage.Para("Sizes are binary, as MPS reads them: 8G is 8GiB, 8 x 2^30 bytes; 512M, 1.5G, or a plain number " +
					"of bytes. Durations are Go durations: 500ms, 2s, 10m. Lists are YAML lists: [root, \"1001\"]; users and " +
					"unix groups are names or numeric ids."),
				manpage.Para("mpsd watches the file: a valid edit is applied without touching unchanged instances, an invalid " +
					"one is logged and the running config stays. The Hot reload section of docs/config.md says which keys " +
					"apply at once and which only when mpsd restarts."),
			}},
			{Title: "Keys", Blocks: top},
			{Title: "Group keys", Blocks: append([]manpage.Block{manpage.Para(
				"Each entry of the groups mapping is a tenant group, NAME its name (1-32 lower-case letters, digits, - or _, " +
					"starting with a letter or digit); its keys are:")}, group...)},
		},
		SeeAlso: []string{"mpsd(8)", "mpsctl(8)", "mps-launch(1)"},
	}, nil
}

// keyBlock is one key's tagged paragraph: "type, default X: meaning".
func keyBlock(docKey, tag string, def, ref any, rows map[string]*docRow) (manpage.Block, bool) {
	row, ok := rows[docKey]
	if !ok || row.meaning == "" {
		return manpage.Block{}, false
	}
	typ, _ := docType(ref)
	var d string
	switch v := def.(type) {
	case marker:
		d = "required"
	case derivedFrom:
		// The reference says how (checked to name the key it comes from).
		d = "default " + plainMarkdown(row.def)
	default:
		d = "default " + plainMarkdown(describeDefault(v))
	}
	return manpage.Item(tag, typ+", "+d+". "+plainMarkdown(row.meaning)), true
}

var (
	mdLink   = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)
	mdStrong = regexp.MustCompile(`\*\*([^*]*)\*\*`)
)

// plainMarkdown is a table cell's markdown as plain text: links are
// their text, code spans and strong emphasis their content.
func plainMarkdown(s string) string {
	s = mdLink.ReplaceAllString(s, "$1")
	s = mdStrong.ReplaceAllString(s, "$1")
	return strings.ReplaceAll(s, "`", "")
}

func TestPlainMarkdown(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"see [security](security.md), rule 22", "see security, rule 22"},
		{"`a` and **b**", "a and b"},
		{"`<run_dir>/<group>`", "<run_dir>/<group>"},
		{"plain", "plain"},
	} {
		if got := plainMarkdown(tc.in); got != tc.want {
			t.Errorf("plainMarkdown(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
