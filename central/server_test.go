package central_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"
	"github.com/golang-jwt/jwt/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/spoolcast/spoolcast/apiversion"
	"github.com/spoolcast/spoolcast/auth"
	"github.com/spoolcast/spoolcast/central"
	"github.com/spoolcast/spoolcast/channel"
	"github.com/spoolcast/spoolcast/devices"
	"github.com/spoolcast/spoolcast/docs"
	"github.com/spoolcast/spoolcast/event"
	"github.com/spoolcast/spoolcast/internal/clock"
	"github.com/spoolcast/spoolcast/internal/httpapi"
	"github.com/spoolcast/spoolcast/internal/oidctest"
	"github.com/spoolcast/spoolcast/internal/pgpool"
	"github.com/spoolcast/spoolcast/internal/pgtest"
	"github.com/spoolcast/spoolcast/internal/ratelimit"
	"github.com/spoolcast/spoolcast/internal/testsignal"
	"github.com/spoolcast/spoolcast/live"
	"github.com/spoolcast/spoolcast/migrations"
	"github.com/spoolcast/spoolcast/sync/ingest"
	"github.com/spoolcast/spoolcast/webhook"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var serviceSecret = []byte("central-tests-service-secret-32-bytes-or-more")

type harness struct {
	t      *testing.T
	url    string
	pool   *pgxpool.Pool
	iss    *oidctest.Issuer
	server *central.Server
	hub    *live.Hub // with options.live
	spec   *openapi3.T
	router routers.Router
}

type options struct {
	versions      *apiversion.Registry
	minAppVersion string
	pool          *pgxpool.Pool // default a pool on a fresh test database
	dbTimeout     time.Duration
	live          bool             // serve /v1/stream
	origins       []string         // AllowedOrigins
	log           io.Writer        // receives central's logs at debug level
	iss           *oidctest.Issuer // default a new one: share one to call two servers with the same tokens
	read          *pgxpool.Pool    // ReadDB, the read replica
	maxReplicaLag time.Duration
	probeInterval time.Duration // ReplicaProbeInterval
	// allowPrivateWebhooks lets webhook endpoints target the tests' loopback receivers.
	allowPrivateWebhooks bool
	vapidPublicKey       string // VAPIDPublicKey
	webPushAllowPrivate  bool   // WebPushAllowPrivate
	userRate             string // UserLimit's rate (--rate-limit-user); empty: none
	maxSocketsPerUser    int    // the hub's MaxSocketsPerUser; 0: its default
	presence             bool   // the hub records presence and seen positions
	clock                clock.Clock
	channels             []channel.Channel // the devices' providers set up beside Expo and Web Push
}

func newHarness(t *testing.T, o options) *harness {
	t.Helper()
	pool := o.pool
	if pool == nil {
		var err error
		if pool, err = pgxpool.New(context.Background(), pgtest.DB(t)); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
	}
	iss := o.iss
	if iss == nil {
		iss = oidctest.New(t)
	}
	users, err := auth.NewUserVerifier(auth.UserVerifierConfig{JWKSURL: iss.JWKSURL(), Issuer: iss.URL(), Audience: oidctest.Audience, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(users.Close)
	services, _ := auth.NewServiceVerifier(serviceSecret)
	logger := slog.New(slog.DiscardHandler)
	if o.log != nil {
		logger = slog.New(slog.NewTextHandler(o.log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	cfg := central.Config{DB: pool, DBTimeout: o.dbTimeout, Users: users, Services: services, Versions: o.versions, OpenAPI: docs.OpenAPI,
		Logger: logger, AllowedOrigins: o.origins, Registry: httpapi.NewRegistry(),
		MaxReplicaLag: o.maxReplicaLag, ReplicaProbeInterval: o.probeInterval}
	if o.read != nil {
		cfg.ReadDB = o.read
	}
	cfg.VAPIDPublicKey, cfg.WebPushAllowPrivate = o.vapidPublicKey, o.webPushAllowPrivate
	if o.channels != nil {
		cfg.Devices = devices.New(pool, nil)
		cfg.Devices.Channels = o.channels
	}
	if o.allowPrivateWebhooks {
		cfg.Webhooks = webhook.NewStore(webhook.StoreConfig{DB: pool, AllowPrivate: true})
	}
	if o.live {
		hub, err := live.New(live.Config{DB: pool, MaxSocketsPerUser: o.maxSocketsPerUser, Presence: o.presence, Metrics: live.NewMetrics(cfg.Registry), Logger: logger})
		if err != nil {
			t.Fatal(err)
		}
		hub.Start(context.Background())
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = hub.Shutdown(ctx)
		})
		testsignal.Eventually(t, "the hub to become ready", 10*time.Second, hub.Ready)
		cfg.Live = hub
	}
	cfg.Clock = o.clock
	if o.minAppVersion != "" {
		cfg.MinAppVersion, _ = apiversion.ParseAppVersion(o.minAppVersion)
	}
	if o.userRate != "" {
		var rate ratelimit.Rate
		if err := rate.UnmarshalText([]byte(o.userRate)); err != nil {
			t.Fatal(err)
		}
		if cfg.UserLimit, err = ratelimit.New(ratelimit.Config{Name: "user", Rate: rate}); err != nil {
			t.Fatal(err)
		}
	}
	srv, err := central.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	spec, router := loadSpec(t)
	return &harness{t: t, url: ts.URL, pool: pool, iss: iss, server: srv, hub: cfg.Live, spec: spec, router: router}
}

func loadSpec(t testing.TB) (*openapi3.T, routers.Router) {
	t.Helper()
	loader := openapi3.NewLoader()
	spec, err := loader.LoadFromData(docs.OpenAPI)
	if err != nil {
		t.Fatal(err)
	}
	if err := spec.Validate(context.Background()); err != nil {
		t.Fatalf("docs/openapi.yaml is not valid OpenAPI: %v", err)
	}
	// Route on paths alone: the servers list names the dev address.
	spec.Servers = nil
	router, err := legacy.NewRouter(spec)
	if err != nil {
		t.Fatal(err)
	}
	return spec, router
}

type response struct {
	status int
	header http.Header
	raw    []byte
	body   map[string]any
}

// do sends req and checks the response against docs/openapi.yaml.
func (h *harness) do(req *http.Request) response {
	h.t.Helper()
	var reqBody []byte
	if req.Body != nil {
		reqBody, _ = io.ReadAll(req.Body)
		req.Body = io.NopCloser(bytes.NewReader(reqBody))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	r := response{status: resp.StatusCode, header: resp.Header, raw: raw}
	if strings.Contains(resp.Header.Get("Content-Type"), "json") && len(raw) > 0 {
		if err := json.Unmarshal(raw, &r.body); err != nil {
			h.t.Fatalf("%s %s: body %q: %v", req.Method, req.URL.Path, raw, err)
		}
	}
	h.validate(req, reqBody, r)
	return r
}

func (h *harness) validate(req *http.Request, reqBody []byte, r response) {
	h.t.Helper()
	vreq := req.Clone(context.Background())
	vreq.URL.Scheme, vreq.URL.Host, vreq.Host = "", "", ""
	vreq.Body = io.NopCloser(bytes.NewReader(reqBody))
	route, params, err := h.router.FindRoute(vreq)
	if err != nil {
		if r.status == http.StatusNotFound || r.status == http.StatusMethodNotAllowed {
			return // no such route, rightly refused
		}
		h.t.Errorf("%s %s answered %d but is not in docs/openapi.yaml: %v", req.Method, req.URL.Path, r.status, err)
		return
	}
	input := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{Request: vreq, PathParams: params, Route: route,
			Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc}},
		Status: r.status,
		Header: r.header,
		Body:   io.NopCloser(bytes.NewReader(r.raw)),
	}
	if err := openapi3filter.ValidateResponse(context.Background(), input); err != nil {
		h.t.Errorf("%s %s → %d does not match docs/openapi.yaml: %v\n%s", req.Method, req.URL.Path, r.status, err, r.raw)
	}
}

func (h *harness) request(method, path, token string, body string, headers ...string) response {
	h.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, h.url+path, rd)
	if err != nil {
		h.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	return h.do(req)
}

func (h *harness) seed(user string, n int) {
	h.t.Helper()
	var items []ingest.Item
	for i := range n {
		ev, err := event.Decode(fmt.Appendf(nil, `{"idempotency_key":"%s-%d","type":"job.finished","category":"jobs","recipients":[%q],"title":"Job %d done","data":{"job":%d}}`, user, i, user, i, i), "")
		if err != nil {
			h.t.Fatal(err)
		}
		items = append(items, ingest.Item{Producer: "jobs", Event: ev, ReceivedAt: time.Now()})
	}
	if _, err := ingest.Ingest(context.Background(), h.pool, items); err != nil {
		h.t.Fatal(err)
	}
}

func TestEveryRegisteredRouteIsDescribed(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	for _, r := range h.server.Routes() {
		pattern := regexp.MustCompile("^" + regexp.MustCompile(`[:*][a-z_]+`).ReplaceAllString(r.Path, `[^/]+`) + "$")
		found := false
		for path, item := range h.spec.Paths.Map() {
			concrete := regexp.MustCompile(`\{[a-z_]+\}`).ReplaceAllString(path, "x1")
			if pattern.MatchString(concrete) && item.GetOperation(r.Method) != nil {
				found = true
			}
		}
		if !found {
			t.Errorf("route %s %s is not described in docs/openapi.yaml", r.Method, r.Path)
		}
	}
	resp := h.request(http.MethodGet, "/openapi.yaml", "", "")
	if resp.status != 200 || !bytes.Equal(resp.raw, docs.OpenAPI) {
		t.Errorf("/openapi.yaml = %d, %d bytes", resp.status, len(resp.raw))
	}
}

func TestTokenAttacksAre401AndAdminNeedsTheRole(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	claims := func(mutate func(jwt.MapClaims)) string {
		c := h.iss.Claims("mallory")
		mutate(c)
		return h.iss.Sign(c)
	}
	none := jwt.NewWithClaims(jwt.SigningMethodNone, h.iss.Claims("mallory"))
	none.Header["kid"] = "rsa-1"
	noneToken, _ := none.SignedString(jwt.UnsafeAllowNoneSignatureType)
	for name, token := range map[string]string{
		"no token":           "",
		"alg none":           noneToken,
		"expired":            claims(func(c jwt.MapClaims) { c["exp"] = time.Now().Add(-time.Hour).Unix() }),
		"not yet valid":      claims(func(c jwt.MapClaims) { c["nbf"] = time.Now().Add(time.Hour).Unix() }),
		"wrong issuer":       claims(func(c jwt.MapClaims) { c["iss"] = "https://evil.example" }),
		"wrong audience":     claims(func(c jwt.MapClaims) { c["aud"] = "other" }),
		"missing user claim": claims(func(c jwt.MapClaims) { delete(c, "sub") }),
		"unknown kid":        h.iss.SignWith("forged", h.iss.Key("rsa-1"), h.iss.Claims("mallory")),
		"garbage":            "garbage",
	} {
		r := h.request(http.MethodGet, "/v1/notifications", token, "")
		if r.status != 401 || !strings.HasPrefix(r.header.Get("WWW-Authenticate"), "Bearer") {
			t.Errorf("%s: %d, WWW-Authenticate %q; want 401 with a Bearer challenge", name, r.status, r.header.Get("WWW-Authenticate"))
		}
	}
	h.seed("bob", 1)
	if r := h.request(http.MethodGet, "/v1/admin/users/bob/notifications", h.iss.Token("alice"), ""); r.status != 403 {
		t.Errorf("admin route without the role = %d, want 403", r.status)
	}
	r := h.request(http.MethodGet, "/v1/admin/users/bob/notifications", h.iss.Token("alice", "admin"), "")
	if r.status != 200 || len(r.body["data"].([]any)) != 1 {
		t.Errorf("admin route with the role = %d %s", r.status, r.raw)
	}
}

func TestVersionsTranslateOldClientsAndWarnOfSunset(t *testing.T) {
	t.Parallel()
	sunset := time.Date(2027, 6, 1, 0, 0, 0, 0, time.UTC)
	// A test layer: the newest version renamed the page's "more" to "has_more"
	// and the query parameter "page_size" to "limit".
	versions, err := apiversion.NewRegistry(
		apiversion.Version{Date: "2026-06-01", Deprecated: true, Sunset: sunset, MigrationURL: "https://docs.spoolcast.dev/migrate/2026-11-30"},
		apiversion.Version{Date: "2026-11-30", Changes: []apiversion.Change{{
			Description: "the page's more is now has_more; page_size is now limit",
			Routes:      []string{"GET /v1/notifications"},
			Request: func(r *http.Request) error {
				q := r.URL.Query()
				if v := q.Get("page_size"); v != "" {
					q.Set("limit", v)
					q.Del("page_size")
					r.URL.RawQuery = q.Encode()
				}
				return nil
			},
			Response: func(status int, body map[string]any) {
				if v, ok := body["has_more"]; ok {
					body["more"] = v
					delete(body, "has_more")
				}
			},
		}}},
	)
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, options{versions: versions})
	h.seed("alice", 3)
	token := h.iss.Token("alice")

	old := h.rawGet("/v1/notifications?page_size=2", token, "2026-06-01")
	if old.status != 200 || old.body["more"] != true || old.body["has_more"] != nil || len(old.body["data"].([]any)) != 2 {
		t.Errorf("old client page = %d %s", old.status, old.raw)
	}
	if old.header.Get(apiversion.Header) != "2026-06-01" || !strings.HasPrefix(old.header.Get("Deprecation"), "@") ||
		old.header.Get("Sunset") != sunset.Format(http.TimeFormat) || !strings.Contains(old.header.Get("Link"), `rel="deprecation"`) {
		t.Errorf("old client headers = %v", old.header)
	}
	cur := h.request(http.MethodGet, "/v1/notifications?limit=2", token, "")
	if cur.body["has_more"] != true || cur.header.Get("Deprecation") != "" || cur.header.Get(apiversion.Header) != "2026-11-30" {
		t.Errorf("current client = %s %v", cur.raw, cur.header)
	}
	if r := h.request(http.MethodGet, "/v1/notifications", token, "", apiversion.Header, "2025-01-01"); r.status != 400 || r.body["type"] != "urn:spoolcast:problem:unknown-api-version" {
		t.Errorf("unknown version = %d %s", r.status, r.raw)
	}
	if r := h.request(http.MethodGet, "/v1/notifications/unread-count", token, "", apiversion.Header, "2026-06-01"); r.body["count"] != float64(3) {
		t.Errorf("a route the change does not touch = %s", r.raw)
	}
	// Each version's traffic is counted, so an old one can be watched
	// before its sunset.
	for series, want := range map[string]string{
		`spoolcast_api_requests_total{code="200",route="GET /v1/notifications",version="2026-06-01"}`:              "1",
		`spoolcast_api_requests_total{code="200",route="GET /v1/notifications",version="2026-11-30"}`:              "1",
		`spoolcast_api_requests_total{code="400",route="GET /v1/notifications",version="unknown"}`:                 "1",
		`spoolcast_api_requests_total{code="200",route="GET /v1/notifications/unread-count",version="2026-06-01"}`: "1",
	} {
		if got := h.metric(series); got != want {
			t.Errorf("%s = %q, want %s", series, got, want)
		}
	}
}

// rawGet skips the OpenAPI check: old versions answer in old shapes.
func (h *harness) rawGet(path, token, version string) response {
	h.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, h.url+path, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set(apiversion.Header, version)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	r := response{status: resp.StatusCode, header: resp.Header, raw: raw}
	_ = json.Unmarshal(raw, &r.body)
	return r
}

func TestOldAppsAreToldToUpdate(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{minAppVersion: "2.3"})
	token := h.iss.Token("alice")
	for app, want := range map[string]int{"": 200, "2.3": 200, "2.3.1": 200, "10.0": 200, "2.2.9": 426, "1": 426, "two": 400} {
		var headers []string
		if app != "" {
			headers = []string{apiversion.AppHeader, app}
		}
		if r := h.request(http.MethodGet, "/v1/notifications", token, "", headers...); r.status != want {
			t.Errorf("app %q = %d, want %d", app, r.status, want)
		}
	}
}

func TestHealthReadinessAndMetrics(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{})
	for _, p := range []string{"/healthz", "/readyz"} {
		if r := h.request(http.MethodGet, p, "", ""); r.status != 200 {
			t.Errorf("%s = %d", p, r.status)
		}
	}
	h.request(http.MethodGet, "/v1/notifications", h.iss.Token("a"), "")
	r := h.request(http.MethodGet, "/metrics", "", "")
	if !bytes.Contains(r.raw, []byte(`spoolcast_central_requests_total{code="200",route="GET /v1/notifications"} 1`)) {
		t.Errorf("metrics lack the feed request:\n%s", r.raw)
	}
}

func TestAHungPostgresIsA503WithinSeconds(t *testing.T) {
	if testing.Short() {
		t.Skip("starts and freezes a Postgres of its own")
	}
	t.Parallel()
	cluster := pgtest.Cluster(t)
	if _, err := migrations.Up(context.Background(), cluster.URL, nil); err != nil {
		t.Fatal(err)
	}
	pool, err := pgpool.New(context.Background(), pgpool.Config{URL: cluster.URL, MaxConns: 4, ConnectTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	h := newHarness(t, options{pool: pool, dbTimeout: time.Second})
	token := h.iss.Token("alice")
	emit, _ := auth.SignServiceToken(serviceSecret, "billing", []string{"push:emit"}, time.Now(), time.Minute)
	if r := h.request(http.MethodGet, "/v1/notifications", token, ""); r.status != http.StatusOK {
		t.Fatalf("feed before the freeze = %d", r.status)
	}
	thaw, err := cluster.Freeze()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(thaw)
	client := &http.Client{Timeout: 15 * time.Second}
	for _, tc := range []struct {
		name string
		req  func() *http.Request
		want int // 0: 503 with Retry-After
	}{
		{"a feed page with a bad limit", func() *http.Request {
			req, _ := http.NewRequest(http.MethodGet, h.url+"/v1/notifications?limit=0", nil)
			req.Header.Set("Authorization", "Bearer "+token)
			return req
		}, http.StatusBadRequest},
		{"the feed", func() *http.Request {
			req, _ := http.NewRequest(http.MethodGet, h.url+"/v1/notifications", nil)
			req.Header.Set("Authorization", "Bearer "+token)
			return req
		}, 0},
		{"the internal ingress", func() *http.Request {
			req, _ := http.NewRequest(http.MethodPost, h.url+"/internal/v1/events", strings.NewReader(`{"idempotency_key":"hung","type":"t","recipients":["alice"],"title":"t"}`))
			req.Header.Set("Authorization", "Bearer "+emit)
			req.Header.Set("Content-Type", "application/json")
			return req
		}, 0},
		{"readiness", func() *http.Request {
			req, _ := http.NewRequest(http.MethodGet, h.url+"/readyz", nil)
			return req
		}, 0},
	} {
		start := time.Now()
		resp, err := client.Do(tc.req())
		if err != nil {
			t.Errorf("%s with Postgres hung: no answer: %v", tc.name, err)
			continue
		}
		resp.Body.Close()
		t.Logf("%s with Postgres hung: %d after %s", tc.name, resp.StatusCode, time.Since(start).Round(time.Millisecond))
		if tc.want != 0 {
			if resp.StatusCode != tc.want {
				t.Errorf("%s with Postgres hung = %d; want %d", tc.name, resp.StatusCode, tc.want)
			}
			continue
		}
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
			t.Errorf("%s with Postgres hung = %d; want 503 with Retry-After", tc.name, resp.StatusCode)
		}
	}
	thaw()
	testsignal.Eventually(t, "the feed to answer 200 after the thaw", 30*time.Second, func() bool {
		return h.request(http.MethodGet, "/v1/notifications", token, "").status == http.StatusOK
	})
}

func TestAFreshServerListsEveryRoutesSeriesAtZero(t *testing.T) {
	t.Parallel()
	h := newHarness(t, options{live: true})
	latest := apiversion.Default().Latest()
	// The first scrape: no API request has been made, and /metrics counts
	// itself only once it has answered.
	r := h.request(http.MethodGet, "/metrics", "", "")
	lines := map[string]bool{}
	for line := range strings.SplitSeq(string(r.raw), "\n") {
		lines[line] = true
	}
	want := func(series string) {
		t.Helper()
		if !lines[series+" 0"] {
			t.Errorf("a fresh server's /metrics lacks %s 0", series)
		}
	}
	for _, rt := range h.server.Routes() {
		route := rt.Method + " " + rt.Path
		// 200, and the 5xx the error alert in deploy/prometheus/rules.yaml selects.
		for _, code := range []string{"200", "500", "503"} {
			want(fmt.Sprintf(`spoolcast_central_requests_total{code=%q,route=%q}`, code, route))
			if versioned := strings.HasPrefix(rt.Path, "/v1/") && rt.Path != "/v1/stream" || strings.HasPrefix(rt.Path, "/internal/"); versioned {
				want(fmt.Sprintf(`spoolcast_api_requests_total{code=%q,route=%q,version=%q}`, code, route, latest))
			}
		}
		want(fmt.Sprintf(`spoolcast_central_request_duration_seconds_count{route=%q}`, route))
	}
	// Routes that succeed with another code have that series too.
	for route, code := range map[string]string{
		"DELETE /v1/devices/:token":       "204",
		"POST /v1/notifications/:id/read": "204",
		"POST /internal/v1/events":        "202",
		"GET /v1/stream":                  "101",
	} {
		want(fmt.Sprintf(`spoolcast_central_requests_total{code=%q,route=%q}`, code, route))
	}
}
