// Package benchfmt formats the benchmarks' figures.
package benchfmt

import (
	"fmt"
	"strings"
)

// Commas writes n with thousands separators.
func Commas[N ~int | ~int64](n N) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var out []byte
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	if neg {
		return "-" + string(out)
	}
	return string(out)
}
