package apiversion

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/spoolcast/spoolcast/internal/problem"
)

// AppHeader carries the client app's version (1.4.2).
const AppHeader = "Spoolcast-App-Version"

// AppVersion is a dotted numeric app version.
type AppVersion []int

// ParseAppVersion reads "1", "1.4" or "1.4.2" (up to four numbers).
func ParseAppVersion(s string) (AppVersion, error) {
	parts := strings.Split(strings.TrimSpace(s), ".")
	if len(parts) == 0 || len(parts) > 4 {
		return nil, fmt.Errorf("app version %q: want numbers separated by dots, like 1.4.2", s)
	}
	v := make(AppVersion, len(parts))
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 || p == "" || (len(p) > 1 && p[0] == '0') {
			return nil, fmt.Errorf("app version %q: want numbers separated by dots, like 1.4.2", s)
		}
		v[i] = n
	}
	return v, nil
}

// Less reports whether v is older than w; missing parts count as 0.
func (v AppVersion) Less(w AppVersion) bool {
	for i := range max(len(v), len(w)) {
		a, b := 0, 0
		if i < len(v) {
			a = v[i]
		}
		if i < len(w) {
			b = w[i]
		}
		if a != b {
			return a < b
		}
	}
	return false
}

func (v AppVersion) String() string {
	parts := make([]string, len(v))
	for i, n := range v {
		parts[i] = strconv.Itoa(n)
	}
	return strings.Join(parts, ".")
}

// RequireApp answers 426 Upgrade Required to apps older than minimum. Requests
// without the header (web clients, tools) pass.
func RequireApp(minimum AppVersion, h http.Handler) http.Handler {
	if minimum == nil {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sent := r.Header.Get(AppHeader)
		if sent == "" {
			h.ServeHTTP(w, r)
			return
		}
		v, err := ParseAppVersion(sent)
		if err != nil {
			problem.Write(w, r, problem.New(http.StatusBadRequest, problem.InvalidAppVersion, AppHeader+": "+err.Error()))
			return
		}
		if v.Less(minimum) {
			problem.Write(w, r, problem.New(http.StatusUpgradeRequired, problem.AppUpdateRequired,
				fmt.Sprintf("this app version (%s) is no longer supported; update the app to %s or later", v, minimum)))
			return
		}
		h.ServeHTTP(w, r)
	})
}
