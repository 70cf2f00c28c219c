// Package mountinfo holds what every reader of /proc/<pid>/mountinfo in
// the project shares: the kernel's escaping of its fields (proc(5)).
package mountinfo

import (
	"strconv"
	"strings"
)

// Unescape undoes the kernel's octal escapes of space, tab, newline and
// backslash (\040, \011, \012, \134) in a mountinfo field.
func Unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
