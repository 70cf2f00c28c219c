package archtest

import (
	"bytes"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// designNotes is the name of the design notes the project started from.
// They are not in the repository (docs/architecture.md replaces them), so
// nothing may cite them. Spelled in two parts so this file does not.
const designNotes = "DESIGN" + ".md"

// designPending lists the files that still cite designNotes because their
// citations are being replaced in another change; each must still cite
// it (so the list cannot go stale), and the list is to be emptied.
var designPending = []string{
	"launcher/doc.go",
	"launcher/errors.go",
	"mpsd/daemon.go",
}

// Every file of the repository cites only docs that exist: a Markdown
// link to a file (relative to the linking file) must name one that is
// there, and a link or a mention of docs/<name>.md (relative to the
// repository root, as in code comments, configs and GitHub URLs) with a
// #section must name a heading of that file. No file cites the design
// notes the project started from.
func TestDocLinks(t *testing.T) {
	root := repoRoot(t)
	anchors := map[string]map[string]bool{} // repo-relative .md → its anchors
	anchorsOf := func(rel string) (map[string]bool, bool) {
		if a, ok := anchors[rel]; ok {
			return a, a != nil
		}
		b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(rel)))
		if err != nil {
			anchors[rel] = nil
			return nil, false
		}
		a := headingAnchors(string(b))
		anchors[rel] = a
		return a, true
	}
	checked, refs := 0, 0
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if p != root && (strings.HasPrefix(name, ".") || name == "bin" || name == "vendor" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() {
			return nil
		}
		info, err := d.Info()
		if err != nil || info.Size() > 4<<20 {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if bytes.IndexByte(b, 0) >= 0 {
			return nil // not text
		}
		rel, _ := filepath.Rel(root, p)
		rel = filepath.ToSlash(rel)
		checked++
		text := string(b)
		pending := slices.Contains(designPending, rel)
		switch cites := strings.Contains(text, designNotes); {
		case cites && !pending:
			t.Errorf("%s cites %s, which is not in the repository: cite docs/architecture.md (or docs/config.md, docs/security.md, api/doc.go) instead", rel, designNotes)
		case !cites && pending:
			t.Errorf("%s no longer cites %s: remove it from designPending", rel, designNotes)
		}
		for _, r := range docRefs(text, strings.HasSuffix(rel, ".md")) {
			refs++
			target := r.target
			if r.fromFile {
				target = path.Join(path.Dir(rel), target)
			}
			target = path.Clean(target)
			if strings.HasPrefix(target, "../") {
				t.Errorf("%s links to %s, outside the repository", rel, r.target)
				continue
			}
			if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(target))); err != nil {
				t.Errorf("%s links to %s, which does not exist", rel, r.target+r.anchor)
				continue
			}
			if r.anchor == "" || !strings.HasSuffix(target, ".md") {
				continue
			}
			if a, ok := anchorsOf(target); !ok || !a[strings.TrimPrefix(r.anchor, "#")] {
				t.Errorf("%s links to %s%s: %s has no such section", rel, r.target, r.anchor, target)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked == 0 || refs == 0 {
		t.Fatalf("checked %d files with %d doc references: the walk found nothing", checked, refs)
	}
}

// docRef is one citation of a repository file.
type docRef struct {
	target   string // the path as written
	anchor   string // "#section", or ""
	fromFile bool   // relative to the citing file's directory, else to the root
}

var (
	// A Markdown link or image: [text](target).
	mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	// A mention of docs/<name>.md anywhere, with what comes before it.
	docMention = regexp.MustCompile(`(?:^|[^A-Za-z0-9_.\-/]|(?:blob|tree)/main/)(docs/[A-Za-z0-9_\-]+(?:/[A-Za-z0-9_\-]+)*\.md)(#[A-Za-z0-9_\-]+)?`)
)

// docRefs finds the citations in a file's text: in Markdown (markdown
// set), every link without a scheme; in any file, every mention of
// docs/<name>.md[#section] that is not part of a longer path (other than a
// GitHub blob URL of this repository's main branch).
func docRefs(text string, markdown bool) []docRef {
	var out []docRef
	if markdown {
		for _, m := range mdLink.FindAllStringSubmatch(text, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") || strings.HasPrefix(target, "#") {
				continue
			}
			target, anchor, _ := strings.Cut(target, "#")
			if anchor != "" {
				anchor = "#" + anchor
			}
			out = append(out, docRef{target: target, anchor: anchor, fromFile: true})
		}
	}
	for _, m := range docMention.FindAllStringSubmatch(text, -1) {
		out = append(out, docRef{target: m[1], anchor: m[2]})
	}
	return out
}

var mdInlineLink = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)

// headingAnchors lists the section anchors GitHub makes for a Markdown
// file's ATX headings (outside code fences): the heading's text in lower
// case, links reduced to their text, everything but letters, digits, "-"
// and "_" dropped and spaces made "-"; a repeated anchor gets "-1", "-2".
func headingAnchors(md string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	fence := ""
	for _, line := range strings.Split(md, "\n") {
		trimmed := strings.TrimSpace(line)
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
			continue
		}
		if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
			fence = trimmed[:3]
			continue
		}
		if !strings.HasPrefix(line, "#") {
			continue
		}
		text := strings.TrimLeft(line, "#")
		if level := len(line) - len(text); level > 6 || (text != "" && text[0] != ' ' && text[0] != '\t') {
			continue
		}
		text = strings.TrimSpace(strings.TrimRight(strings.TrimSpace(text), "#"))
		text = mdInlineLink.ReplaceAllString(text, "$1")
		var b strings.Builder
		for _, r := range strings.ToLower(text) {
			switch {
			case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
				b.WriteRune(r)
			case r == ' ':
				b.WriteByte('-')
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			seen[a] = n + 1
			a += "-" + strconv.Itoa(n)
		} else {
			seen[a] = 1
		}
		out[a] = true
	}
	return out
}

func TestHeadingAnchors(t *testing.T) {
	md := "# Title\n" +
		"## 4. Compute mode\n" +
		"## `groups.<name>`\n" +
		"## mps-launch's command line and exit statuses\n" +
		"## See [the API](../api/doc.go) here\n" +
		"### Hot reload ###\n" +
		"## Hot reload\n" +
		"```sh\n# not a heading\n```\n" +
		"#not-a-heading\n"
	got := headingAnchors(md)
	want := []string{"title", "4-compute-mode", "groupsname", "mps-launchs-command-line-and-exit-statuses", "see-the-api-here", "hot-reload", "hot-reload-1"}
	for _, a := range want {
		if !got[a] {
			t.Errorf("anchor %q missing; got %v", a, got)
		}
	}
	if len(got) != len(want) {
		t.Errorf("got %d anchors %v, want %d %v", len(got), got, len(want), want)
	}
}

func TestDocRefs(t *testing.T) {
	for _, tc := range []struct {
		name     string
		text     string
		markdown bool
		want     []docRef
	}{
		{"go comment", "// (docs/architecture.md#the-launch-path).", false,
			[]docRef{{target: "docs/architecture.md", anchor: "#the-launch-path"}}},
		{"no anchor", "see docs/config.md.", false, []docRef{{target: "docs/config.md"}}},
		{"GitHub URL", "runbook_url: https://github.com/mpsd/mpsd/blob/main/docs/alerts.md#mpsddown", false,
			[]docRef{{target: "docs/alerts.md", anchor: "#mpsddown"}}},
		{"longer path", "/usr/share/doc/mpsd/docs/x.md and mydocs/x.md", false, nil},
		{"markdown link", "[install](install.md#4-compute-mode) and [web](https://x.org/a.md) and [here](#top)", true,
			[]docRef{{target: "install.md", anchor: "#4-compute-mode", fromFile: true}}},
		{"markdown link and mention", "[a](docs/security.md)", true,
			[]docRef{{target: "docs/security.md", fromFile: true}, {target: "docs/security.md"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := docRefs(tc.text, tc.markdown); !slices.Equal(got, tc.want) {
				t.Errorf("docRefs(%q) = %+v, want %+v", tc.text, got, tc.want)
			}
		})
	}
}
