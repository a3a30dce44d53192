package central

// Topics: services manage them and their members (/internal/v1/topics,
// scope topics:manage); users list theirs and subscribe themselves to the
// open ones (/v1/topics).

import (
	"errors"
	"net/http"
	"strconv"

	"github.com/julienschmidt/httprouter"

	"github.com/spoolcast/spoolcast/auth"
	"github.com/spoolcast/spoolcast/internal/httpapi"
	"github.com/spoolcast/spoolcast/internal/problem"
	"github.com/spoolcast/spoolcast/topics"
)

// maxMembersBody caps a membership change's body: 10,000 user ids of up
// to 256 bytes each, every byte escaped as JSON encoders may (\u003c is
// six bytes), fit in 16 MiB.
const maxMembersBody = 16 << 20

func (s *Server) routeTopics() {
	s.handleService(http.MethodPut, "/internal/v1/topics/:topic", auth.ScopeTopics, s.setTopic)
	s.handleService(http.MethodGet, "/internal/v1/topics/:topic", auth.ScopeTopics, s.getTopic)
	s.handleService(http.MethodPost, "/internal/v1/topics/:topic/members", auth.ScopeTopics, s.changeMembers)
	s.handleUser(http.MethodGet, "/v1/topics", user, s.listTopics)
	s.handleUser(http.MethodPut, "/v1/topics/:topic/subscription", user, s.subscribe)
	s.handleUser(http.MethodDelete, "/v1/topics/:topic/subscription", user, s.unsubscribe)
	s.handleUser(http.MethodGet, "/v1/admin/topic-fanouts", admin, s.listFanouts)
}

// fanoutPage is the body of GET /v1/admin/topic-fanouts.
type fanoutPage struct {
	Fanouts []topics.FanoutStatus `json:"fanouts"`
	// NextBefore, when set, is the before of the next page.
	NextBefore *int64 `json:"next_before"`
}

// listFanouts lists topic fan-outs and their progress, newest first.
func (s *Server) listFanouts(w http.ResponseWriter, r *http.Request, _ httprouter.Params, _ auth.User) {
	q := r.URL.Query()
	f := topics.FanoutFilter{State: q.Get("state"), Topic: q.Get("topic"), Producer: q.Get("producer"), IdempotencyKey: q.Get("idempotency_key")}
	for _, p := range []struct {
		name string
		max  int64
		set  func(int64)
	}{
		{"limit", topics.MaxFanoutPage, func(n int64) { f.Limit = int(n) }},
		{"before", 1 << 62, func(n int64) { f.Before = n }},
	} {
		if v := q.Get(p.name); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 1 || n > p.max {
				problem.Write(w, r, problem.New(http.StatusBadRequest, problem.InvalidQuery,
					p.name+" must be a whole number from 1 to "+strconv.FormatInt(p.max, 10)).On(p.name))
				return
			}
			p.set(n)
		}
	}
	if err := topics.CheckFanoutFilter(f); err != nil {
		problem.Write(w, r, problem.New(http.StatusBadRequest, problem.InvalidQuery, err.Error()))
		return
	}
	ctx, cancel := s.dbContext(r)
	defer cancel()
	list, more, err := s.cfg.Topics.Fanouts(ctx, f)
	if err != nil {
		s.dbError(w, r, "list topic fan-outs", err)
		return
	}
	page := fanoutPage{Fanouts: list}
	if page.Fanouts == nil {
		page.Fanouts = []topics.FanoutStatus{}
	}
	if more {
		next := list[len(list)-1].ID
		page.NextBefore = &next
	}
	httpapi.WriteJSON(w, http.StatusOK, page)
}

// topicError answers a topics store's error.
func (s *Server) topicError(w http.ResponseWriter, r *http.Request, what string, err error) {
	switch {
	case errors.Is(err, topics.ErrInvalid):
		problem.Write(w, r, problem.New(http.StatusBadRequest, problem.InvalidRequest, err.Error()))
	case errors.Is(err, topics.ErrNotFound):
		problem.Write(w, r, problem.New(http.StatusNotFound, problem.NotFound, "no such topic open to subscription"))
	default:
		s.dbError(w, r, what, err)
	}
}

func (s *Server) setTopic(w http.ResponseWriter, r *http.Request, _ auth.ServiceClaims) {
	var body struct {
		Open *bool `json:"open"`
	}
	if !readJSON(w, r, &body) {
		return
	}
	if body.Open == nil {
		problem.Write(w, r, problem.New(http.StatusBadRequest, problem.InvalidRequest, "open is required: true lets users subscribe and unsubscribe themselves").On("open"))
		return
	}
	ctx, cancel := s.dbContext(r)
	defer cancel()
	t, created, err := s.cfg.Topics.Set(ctx, httprouter.ParamsFromContext(r.Context()).ByName("topic"), *body.Open)
	if err != nil {
		s.topicError(w, r, "set topic", err)
		return
	}
	httpapi.WriteJSON(w, createdOrOK(created), t)
}

func (s *Server) getTopic(w http.ResponseWriter, r *http.Request, _ auth.ServiceClaims) {
	ctx, cancel := s.dbContext(r)
	defer cancel()
	t, err := s.cfg.Topics.Get(ctx, httprouter.ParamsFromContext(r.Context()).ByName("topic"))
	if errors.Is(err, topics.ErrNotFound) {
		problem.Write(w, r, problem.New(http.StatusNotFound, problem.NotFound, "no such topic"))
		return
	}
	if err != nil {
		s.topicError(w, r, "read topic", err)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, t)
}

func (s *Server) changeMembers(w http.ResponseWriter, r *http.Request, _ auth.ServiceClaims) {
	var body struct {
		Add    []string `json:"add"`
		Remove []string `json:"remove"`
	}
	if !readJSONUpTo(w, r, &body, maxMembersBody) {
		return
	}
	ctx, cancel := s.dbContext(r)
	defer cancel()
	c, err := s.cfg.Topics.ChangeMembers(ctx, httprouter.ParamsFromContext(r.Context()).ByName("topic"), body.Add, body.Remove)
	if err != nil {
		s.topicError(w, r, "change members", err)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, c)
}

// topicsJSON is a page of a user's topics.
type topicsJSON struct {
	Data []topics.Subscription `json:"data"`
	// NextAfter is the after of the next page, when there is one.
	NextAfter string `json:"next_after,omitempty"`
}

func (s *Server) listTopics(w http.ResponseWriter, r *http.Request, _ httprouter.Params, u auth.User) {
	q := r.URL.Query()
	limit := 100
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > topics.MaxListPage {
			problem.Write(w, r, problem.New(http.StatusBadRequest, problem.InvalidRequest, "limit must be 1 to "+strconv.Itoa(topics.MaxListPage)).On("limit"))
			return
		}
		limit = n
	}
	after := q.Get("after")
	if after != "" {
		if err := topics.CheckName(after); err != nil {
			problem.Write(w, r, problem.New(http.StatusBadRequest, problem.InvalidRequest, "after: "+err.Error()).On("after"))
			return
		}
	}
	ctx, cancel := s.dbContext(r)
	defer cancel()
	subs, more, err := s.cfg.Topics.List(ctx, u.ID, after, limit)
	if err != nil {
		s.topicError(w, r, "list topics", err)
		return
	}
	out := topicsJSON{Data: subs}
	if out.Data == nil {
		out.Data = []topics.Subscription{}
	}
	if more {
		out.NextAfter = subs[len(subs)-1].Topic
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
}

func (s *Server) subscribe(w http.ResponseWriter, r *http.Request, ps httprouter.Params, u auth.User) {
	ctx, cancel := s.dbContext(r)
	defer cancel()
	sub, created, err := s.cfg.Topics.Subscribe(ctx, u.ID, ps.ByName("topic"))
	if err != nil {
		s.topicError(w, r, "subscribe", err)
		return
	}
	httpapi.WriteJSON(w, createdOrOK(created), sub)
}

func (s *Server) unsubscribe(w http.ResponseWriter, r *http.Request, ps httprouter.Params, u auth.User) {
	ctx, cancel := s.dbContext(r)
	defer cancel()
	if err := s.cfg.Topics.Unsubscribe(ctx, u.ID, ps.ByName("topic")); err != nil {
		s.topicError(w, r, "unsubscribe", err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// createdOrOK is 201 for what a PUT created, 200 for what it found.
func createdOrOK(created bool) int {
	if created {
		return http.StatusCreated
	}
	return http.StatusOK
}
