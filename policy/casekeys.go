package policy

import (
	"fmt"
	"strings"

	"go.yaml.in/yaml/v3"
)

// caseCollisions reports keys of one mapping that differ only in case
// (`Inference:` beside `inference:`, `Memory:` beside `memory:`). Viper
// folds keys to lower case, so it would merge them silently and one
// value would replace the other; an operator who wrote both meant two
// things, and is told which lines clash. doc is the file's parsed tree.
func caseCollisions(doc *yaml.Node) []Problem {
	var ps []Problem
	var walk func(n *yaml.Node, path string)
	walk = func(n *yaml.Node, path string) {
		switch n.Kind {
		case yaml.DocumentNode, yaml.SequenceNode:
			for i, c := range n.Content {
				p := path
				if n.Kind == yaml.SequenceNode {
					p = fmt.Sprintf("%s[%d]", path, i)
				}
				walk(c, p)
			}
		case yaml.MappingNode:
			seen := map[string]*yaml.Node{}
			for i := 0; i+1 < len(n.Content); i += 2 {
				k, v := n.Content[i], n.Content[i+1]
				low := strings.ToLower(k.Value)
				key := k.Value
				if path != "" {
					key = path + "." + k.Value
				}
				if first, dup := seen[low]; dup && first.Value != k.Value {
					ps = append(ps, Problem{Key: key, Message: fmt.Sprintf(
						"line %d: %q and %q (line %d) differ only in case; keys are read case-insensitively, so one would silently replace the other: keep one spelling",
						k.Line, k.Value, first.Value, first.Line)})
				} else if !dup {
					seen[low] = k
				}
				walk(v, key)
			}
		}
	}
	walk(doc, "")
	return ps
}
