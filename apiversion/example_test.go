package apiversion_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/spoolcast/spoolcast/apiversion"
)

// A handler that speaks only the newest version serves an older client through
// the newest version's response layer.
func ExampleRegistry_Wrap() {
	versions, _ := apiversion.NewRegistry(
		apiversion.Version{Date: "2026-06-01"},
		apiversion.Version{Date: "2026-11-30", Changes: []apiversion.Change{{
			Description: "count was renamed total",
			Response: func(_ int, body map[string]any) {
				body["count"] = body["total"]
				delete(body, "total")
			},
		}}},
	)
	h := versions.Wrap("GET /things", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"total":3}`)
	}))
	for _, v := range []string{"", "2026-06-01", "1999-01-01"} {
		req := httptest.NewRequest(http.MethodGet, "/things", nil)
		if v != "" {
			req.Header.Set(apiversion.Header, v)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		body := strings.TrimSpace(w.Body.String())
		fmt.Println(w.Code, w.Header().Get(apiversion.Header), body[:min(len(body), 45)])
	}
	// Output:
	// 200 2026-11-30 {"total":3}
	// 200 2026-06-01 {"count":3}
	// 400 2026-11-30 {"type":"urn:spoolcast:problem:unknown-api-ve
}
