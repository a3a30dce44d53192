// Package problem writes RFC 9457 problem details (application/problem+json),
// the one error shape every spoolcast HTTP API answers with.
package problem

import (
	"encoding/json"
	"net/http"
)

// ContentType is the media type of a problem document.
const ContentType = "application/problem+json"

// Problem is an RFC 9457 problem document. Type is a stable URI clients branch
// on; Title is its short human summary; Detail explains this occurrence.
type Problem struct {
	Type     string `json:"type"`
	Title    string `json:"title"`
	Status   int    `json:"status"`
	Detail   string `json:"detail,omitempty"`
	Instance string `json:"instance,omitempty"`
	// Field names the request field at fault, where there is one.
	Field string `json:"field,omitempty"`
}

// typeURI returns the problem type URI for a short slug such as "invalid-event".
func typeURI(slug string) string { return "urn:spoolcast:problem:" + slug }

// New returns a problem of type t with status and detail.
func New(status int, t Type, detail string) Problem {
	return Problem{Type: t.URI(), Title: t.Title, Status: status, Detail: detail}
}

// On returns p naming field as the request field at fault.
func (p Problem) On(field string) Problem {
	p.Field = field
	return p
}

// Write sends p with its status. The request path becomes the instance when none is set.
func Write(w http.ResponseWriter, r *http.Request, p Problem) {
	if p.Instance == "" && r != nil {
		p.Instance = r.URL.Path
	}
	w.Header().Set("Content-Type", ContentType)
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(p.Status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(p)
}
