package policy

import (
	"bufio"
	"fmt"
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/spf13/viper"
)

// configDoc is the configuration reference that must agree with the schema.
const configDoc = "../docs/config.md"

// groupDocPrefix is how the reference writes the keys of one group.
const groupDocPrefix = groupsKey + ".<name>."

// docRow is one key as docs/config.md documents it.
type docRow struct {
	line     int
	typ, def string
	// meaning is the row's "meaning" cell (markdown), "" without one.
	meaning string
}

// docTableSeparator matches a markdown table's second line: |---|:--:|.
var docTableSeparator = regexp.MustCompile(`^\|(\s*:?-+:?\s*\|)+\s*$`)

// docCode matches an inline code span.
var docCode = regexp.MustCompile("`([^`]*)`")

// splitDocRow splits a markdown table row into trimmed cells.
func splitDocRow(line string) []string {
	line = strings.TrimSpace(line)
	line = strings.TrimPrefix(line, "|")
	line = strings.TrimSuffix(line, "|")
	cells := strings.Split(line, "|")
	for i := range cells {
		cells[i] = strings.TrimSpace(cells[i])
	}
	return cells
}

// readConfigDoc returns the rows of every table of the reference whose
// header has "key" as its first column and a "type" and a "default" column,
// by key; and the YAML code blocks that are whole config files.
func readConfigDoc(t *testing.T) (rows map[string]*docRow, examples []string) {
	t.Helper()
	f, err := os.Open(configDoc)
	if err != nil {
		t.Fatalf("the configuration reference: %v", err)
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}

	rows = map[string]*docRow{}
	for i := 0; i < len(lines); i++ {
		if strings.HasPrefix(strings.TrimSpace(lines[i]), "```yaml") {
			var b strings.Builder
			for i++; i < len(lines) && strings.TrimSpace(lines[i]) != "```"; i++ {
				b.WriteString(lines[i] + "\n")
			}
			if strings.HasPrefix(b.String(), "version:") {
				examples = append(examples, b.String())
			}
			continue
		}
		if !strings.HasPrefix(lines[i], "|") || i+1 >= len(lines) || !docTableSeparator.MatchString(lines[i+1]) {
			continue
		}
		header := splitDocRow(lines[i])
		col := map[string]int{}
		for j, h := range header {
			col[strings.ToLower(h)] = j
		}
		typeCol, hasType := col["type"]
		defCol, hasDef := col["default"]
		meaningCol, hasMeaning := col["meaning"]
		if strings.ToLower(header[0]) != "key" || !hasType || !hasDef {
			continue
		}
		for i += 2; i < len(lines) && strings.HasPrefix(lines[i], "|"); i++ {
			cells := splitDocRow(lines[i])
			m := docCode.FindStringSubmatch(cells[0])
			if len(cells) != len(header) || m == nil || m[0] != cells[0] {
				t.Errorf("%s:%d: a row of a key table must have %d cells and a key in backquotes first: %q",
					configDoc, i+1, len(header), lines[i])
				continue
			}
			key := m[1]
			if r, dup := rows[key]; dup {
				t.Errorf("%s:%d: key %s is documented twice (first on line %d)", configDoc, i+1, key, r.line)
				continue
			}
			rows[key] = &docRow{line: i + 1, typ: cells[typeCol], def: cells[defCol]}
			if hasMeaning {
				rows[key].meaning = cells[meaningCol]
			}
		}
		i-- // the loop's i++ must not skip the line after the table
	}
	return rows, examples
}

// docType is the word the reference uses for the Go type a key decodes into.
func docType(ref any) (string, bool) {
	switch ref.(type) {
	case *string:
		return "string", true
	case *bool:
		return "bool", true
	case *int:
		return "integer", true
	case *time.Duration:
		return "duration", true
	case *size:
		return "size", true
	case *[]string:
		return "list", true
	}
	return "", false
}

// yamlValue reads text as the value of a YAML key, as the config's viper
// would decode it.
func yamlValue(text string) (any, error) {
	v := viper.New()
	v.SetConfigType("yaml")
	if err := v.ReadConfig(strings.NewReader("value: " + text + "\n")); err != nil {
		return nil, err
	}
	return v.Get("value"), nil
}

// checkDocField compares one schema field with its row: the type word, and
// the default, decoded from the page and from the schema into separate
// values of T and compared.
func checkDocField[T any](t *testing.T, key string, f field[T], row *docRow) {
	t.Helper()
	var zero T
	want, ok := docType(f.ref(&zero))
	switch {
	case !ok:
		t.Errorf("%s: the schema decodes it into %T, which config_doc_test.go has no word for; add one to docType and use it in %s",
			key, f.ref(&zero), configDoc)
	case row.typ != want:
		t.Errorf("%s:%d: %s: type documented as %q, want %q (the schema decodes it into %T)",
			configDoc, row.line, key, row.typ, want, f.ref(&zero))
	}

	switch def := f.def.(type) {
	case marker:
		if def == required && row.def != "required" {
			t.Errorf("%s:%d: %s: default documented as %q; the schema requires the key: write required",
				configDoc, row.line, key, row.def)
		}
	case derivedFrom:
		if !strings.Contains(row.def, "`"+string(def)+"`") {
			t.Errorf("%s:%d: %s: default documented as %q; the schema derives it from %s: name `%s` there",
				configDoc, row.line, key, row.def, def, def)
		}
	default:
		m := docCode.FindStringSubmatch(row.def)
		if m == nil {
			t.Errorf("%s:%d: %s: default documented as %q; the schema's is %v: write it in backquotes",
				configDoc, row.line, key, row.def, def)
			return
		}
		documented, err := yamlValue(m[1])
		if err != nil {
			t.Errorf("%s:%d: %s: documented default %s is not YAML: %v", configDoc, row.line, key, m[0], err)
			return
		}
		var fromDoc, fromSchema T
		d := newDecoder()
		d.decodeLeaf(key, f.ref(&fromDoc), documented)
		if len(d.problems) > 0 {
			t.Errorf("%s:%d: %s: documented default %s does not decode: %v", configDoc, row.line, key, m[0], d.problems)
			return
		}
		if !decodeDefault(f.ref(&fromSchema), def) {
			t.Fatalf("%s: the schema's default %v does not decode", key, def)
		}
		got := reflect.ValueOf(f.ref(&fromDoc)).Elem().Interface()
		wantV := reflect.ValueOf(f.ref(&fromSchema)).Elem().Interface()
		if !reflect.DeepEqual(got, wantV) {
			t.Errorf("%s:%d: %s: default documented as %s, but the schema's is %s",
				configDoc, row.line, key, m[0], describeDefault(def))
		}
	}
}

// describeDefault writes a schema default the way the reference would.
func describeDefault(def any) string {
	switch v := def.(type) {
	case string:
		if v == "" {
			return "`\"\"`"
		}
		return "`" + v + "`"
	case []any:
		s := make([]string, len(v))
		for i, e := range v {
			s[i] = fmt.Sprint(e)
		}
		return "`[" + strings.Join(s, ", ") + "]`"
	default:
		return fmt.Sprintf("`%v`", v)
	}
}

// TestConfigDocMatchesSchema keeps docs/config.md, the configuration
// reference, in agreement with the schema: the same keys, each with the
// type it decodes into and the default the schema applies (or "required",
// or the key a derived default comes from).
func TestConfigDocMatchesSchema(t *testing.T) {
	rows, _ := readConfigDoc(t)
	if len(rows) == 0 {
		t.Fatalf("%s has no key tables (| key | type | default | meaning |)", configDoc)
	}
	schemaKeys := map[string]bool{}
	for _, f := range configFields {
		schemaKeys[f.key] = true
		row, ok := rows[f.key]
		if !ok {
			t.Errorf("%s: in the schema (default %s) but not documented in %s", f.key, describeSchemaDefault(f.def), configDoc)
			continue
		}
		checkDocField(t, f.key, f, row)
	}
	for _, f := range groupFields {
		key := groupDocPrefix + f.key
		schemaKeys[key] = true
		row, ok := rows[key]
		if !ok {
			t.Errorf("%s: in the schema (default %s) but not documented in %s", key, describeSchemaDefault(f.def), configDoc)
			continue
		}
		checkDocField(t, key, f, row)
	}
	for key, row := range rows {
		if !schemaKeys[key] {
			t.Errorf("%s:%d: %s is documented but is not a key of the schema (policy/schema.go)", configDoc, row.line, key)
		}
	}
}

func describeSchemaDefault(def any) string {
	switch v := def.(type) {
	case marker:
		return "required"
	case derivedFrom:
		return "derived from " + string(v)
	}
	return describeDefault(def)
}

// The reference's example files are valid configs.
func TestConfigDocExamplesParse(t *testing.T) {
	_, examples := readConfigDoc(t)
	for i, ex := range examples {
		if _, err := Parse(strings.NewReader(ex), Host{Users: testUsers}); err != nil {
			t.Errorf("%s: example %d does not parse: %v\n%s", configDoc, i+1, err, ex)
		}
	}
}
