// Package apiversion keeps old API versions working without copies of the
// handlers. Handlers speak only the newest version; each version lists the
// changes it made as small translation layers: a request layer upgrades a
// request from the version before, a response layer downgrades a response to
// it. A request pinned to an old version passes up through every newer
// version's request layers, and its response back down through their response
// layers.
//
// Clients pin a version with the Spoolcast-Version: YYYY-MM-DD header; absent
// means the newest, unknown is a 400, and every response names the version served.
package apiversion

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/spoolcast/spoolcast/internal/problem"
)

// Header carries the version a request asks for and the response serves.
const Header = "Spoolcast-Version"

// Change is one backwards-incompatible change a version made.
type Change struct {
	// Description says what changed, for the changelog.
	Description string
	// Routes limits the change to these routes ("GET /v1/notifications"); empty means all.
	Routes []string
	// Request rewrites a request made for the version before the change into
	// the shape after it. Nil leaves requests alone.
	Request func(r *http.Request) error
	// Response rewrites a JSON response body made after the change into the
	// shape before it. Nil leaves responses alone.
	Response func(status int, body map[string]any)
}

func (c Change) appliesTo(route string) bool {
	return len(c.Routes) == 0 || slices.Contains(c.Routes, route)
}

// Version is one dated API version.
type Version struct {
	// Date names the version, YYYY-MM-DD.
	Date string
	// Changes are what this version changed relative to the one before it.
	Changes []Change
	// Deprecated versions answer with Deprecation, Sunset and Link headers.
	Deprecated bool
	// DeprecatedAt is when the version was deprecated (the Deprecation header).
	DeprecatedAt time.Time
	// Sunset is when the version stops working; zero when not yet decided.
	Sunset time.Time
	// MigrationURL points at the note that tells clients how to move on.
	MigrationURL string
}

// Registry is the list of versions, oldest first.
type Registry struct {
	versions []Version
	index    map[string]int
}

// NewRegistry checks and orders versions.
func NewRegistry(versions ...Version) (*Registry, error) {
	if len(versions) == 0 {
		return nil, fmt.Errorf("apiversion: no versions")
	}
	r := &Registry{versions: slices.Clone(versions), index: map[string]int{}}
	slices.SortFunc(r.versions, func(a, b Version) int { return cmp.Compare(a.Date, b.Date) })
	for i, v := range r.versions {
		if _, err := time.Parse(time.DateOnly, v.Date); err != nil {
			return nil, fmt.Errorf("apiversion: version %q is not YYYY-MM-DD", v.Date)
		}
		if _, dup := r.index[v.Date]; dup {
			return nil, fmt.Errorf("apiversion: version %s listed twice", v.Date)
		}
		r.index[v.Date] = i
	}
	if r.versions[len(r.versions)-1].Deprecated {
		return nil, fmt.Errorf("apiversion: the newest version %s cannot be deprecated", r.Latest())
	}
	return r, nil
}

// Latest is the newest version, served when a request names none.
func (r *Registry) Latest() string { return r.versions[len(r.versions)-1].Date }

// Versions returns the versions, oldest first.
func (r *Registry) Versions() []Version { return slices.Clone(r.versions) }

// Served is the version Wrap serves req in: the one it asks for, or the
// newest when it names none; "unknown" when it names one this API does not
// have (Wrap answers 400).
func (r *Registry) Served(req *http.Request) string {
	asked := req.Header.Get(Header)
	if asked == "" {
		return r.Latest()
	}
	if _, ok := r.index[asked]; !ok {
		return "unknown"
	}
	return asked
}

// Wrap serves h, which speaks the newest version, to clients of any version.
// route names the route for Change.Routes.
func (r *Registry) Wrap(route string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		asked := req.Header.Get(Header)
		if asked == "" {
			asked = r.Latest()
		}
		i, ok := r.index[asked]
		if !ok {
			p := problem.New(http.StatusBadRequest, problem.UnknownAPIVersion,
				fmt.Sprintf("%s %q is not a version of this API; the newest is %s", Header, asked, r.Latest()))
			w.Header().Set(Header, r.Latest())
			problem.Write(w, req, p)
			return
		}
		v := r.versions[i]
		w.Header().Set(Header, v.Date)
		w.Header().Add("Vary", Header)
		if v.Deprecated {
			setDeprecationHeaders(w.Header(), v)
		}
		newer := r.versions[i+1:]
		for _, nv := range newer {
			for _, c := range nv.Changes {
				if c.Request == nil || !c.appliesTo(route) {
					continue
				}
				if err := c.Request(req); err != nil {
					problem.Write(w, req, problem.New(http.StatusBadRequest, problem.InvalidRequest, err.Error()))
					return
				}
			}
		}
		var down []Change
		for j := len(newer) - 1; j >= 0; j-- {
			for _, c := range newer[j].Changes {
				if c.Response != nil && c.appliesTo(route) {
					down = append(down, c)
				}
			}
		}
		if len(down) == 0 {
			h.ServeHTTP(w, req)
			return
		}
		buf := &bufferedWriter{header: http.Header{}, status: http.StatusOK}
		h.ServeHTTP(buf, req)
		body := buf.body.Bytes()
		var doc map[string]any
		if ct := buf.header.Get("Content-Type"); (ct == "application/json" || ct == problem.ContentType) && json.Unmarshal(body, &doc) == nil {
			for _, c := range down {
				c.Response(buf.status, doc)
			}
			if b, err := json.Marshal(doc); err == nil {
				body = append(b, '\n')
			}
		}
		for k, vs := range buf.header {
			if k == "Link" { // keep the deprecation link beside the handler's
				for _, v := range vs {
					w.Header().Add(k, v)
				}
				continue
			}
			w.Header()[k] = vs
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.WriteHeader(buf.status)
		_, _ = w.Write(body)
	})
}

// setDeprecationHeaders follows RFC 9745 (Deprecation, Link rel="deprecation")
// and RFC 8594 (Sunset).
func setDeprecationHeaders(h http.Header, v Version) {
	at := v.DeprecatedAt
	if at.IsZero() {
		at, _ = time.Parse(time.DateOnly, v.Date)
	}
	h.Set("Deprecation", "@"+strconv.FormatInt(at.Unix(), 10))
	if !v.Sunset.IsZero() {
		h.Set("Sunset", v.Sunset.UTC().Format(http.TimeFormat))
	}
	if v.MigrationURL != "" {
		h.Add("Link", fmt.Sprintf(`<%s>; rel="deprecation"; type="text/html"`, v.MigrationURL))
	}
}

// bufferedWriter holds a response so that response layers can rewrite it.
type bufferedWriter struct {
	header http.Header
	status int
	body   bytes.Buffer
	wrote  bool
}

func (b *bufferedWriter) Header() http.Header { return b.header }

func (b *bufferedWriter) WriteHeader(status int) {
	if !b.wrote {
		b.status, b.wrote = status, true
	}
}

func (b *bufferedWriter) Write(p []byte) (int, error) {
	b.wrote = true
	return b.body.Write(p)
}
