package central

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"sync"

	"github.com/julienschmidt/httprouter"

	"github.com/spoolcast/spoolcast/auth"
	"github.com/spoolcast/spoolcast/feed"
	"github.com/spoolcast/spoolcast/internal/httpapi"
	"github.com/spoolcast/spoolcast/internal/problem"
	"github.com/spoolcast/spoolcast/live"
)

// pageBodies are the buffers page documents are encoded into.
var pageBodies = sync.Pool{New: func() any { b := make([]byte, 0, 16<<10); return &b }}

// writePageBody answers 200 with a page document (docs/api.md): its items,
// has_more, next_cursor, and the refresh_cursor of a first page or a since
// read. It is encoded by hand (feed.AppendPageJSON, what encoding/json
// would write) and sent with its length in one write.
func writePageBody(w http.ResponseWriter, items []feed.Notification, hasMore bool, next, refresh *string) {
	buf := pageBodies.Get().(*[]byte)
	body := feed.AppendPageJSON((*buf)[:0], items, hasMore, next, refresh)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
	if cap(body) <= 1<<20 { // a page of 100 large items is not kept
		*buf = body
		pageBodies.Put(buf)
	}
}

// pageQuery reads limit, cursor and unread from the query string q.
func pageQuery(q url.Values, userID string) (feed.Query, *problem.Problem) {
	out := feed.Query{UserID: userID, Limit: feed.DefaultLimit}
	bad := func(field, detail string) (feed.Query, *problem.Problem) {
		p := problem.New(http.StatusBadRequest, problem.InvalidQuery, detail).On(field)
		return feed.Query{}, &p
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > feed.MaxLimit {
			return bad("limit", "limit must be a whole number from 1 to "+strconv.Itoa(feed.MaxLimit))
		}
		out.Limit = n
	}
	if v, ok := q["cursor"]; ok {
		c, err := feed.DecodeCursor(v[0])
		if err != nil {
			p := problem.New(http.StatusBadRequest, problem.InvalidCursor, "cursor is not one this server issued; start again without it").On("cursor")
			return feed.Query{}, &p
		}
		out.After = &c
	}
	// status names the tab; unread=true is the unread tab, as before tabs.
	if v, ok := q["status"]; ok {
		st, ok := feed.ParseStatus(v[0])
		if !ok {
			return bad("status", "status must be all, unread or archived")
		}
		out.Status = st
	}
	switch q.Get("unread") {
	case "", "false":
		if q.Get("unread") == "false" && out.Status == feed.Unread {
			return bad("unread", "unread=false contradicts status=unread; send one of them")
		}
	case "true":
		if q.Has("status") && out.Status != feed.Unread {
			return bad("unread", "unread=true is status=unread; it does not combine with status="+out.Status.String())
		}
		out.Status = feed.Unread
	default:
		return bad("unread", "unread must be true or false")
	}
	return out, nil
}

func (s *Server) listNotifications(w http.ResponseWriter, r *http.Request, _ httprouter.Params, u auth.User) {
	q := r.URL.Query()
	if v, ok := q["since"]; ok {
		s.writeChanges(w, r, q, u.ID, v[0])
		return
	}
	// A first page carries the cursor that a later since read starts from.
	// It is read in the page's statement, on the same server, so that
	// everything committed before it is on the page (or further down the
	// feed) and everything after it is returned by since; an item may be
	// in both.
	s.writePage(w, r, q, u.ID, !q.Has("cursor"))
}

// writeChanges is a since read: the caller's notifications committed after
// the refresh cursor, oldest first, for clients without a socket.
func (s *Server) writeChanges(w http.ResponseWriter, r *http.Request, q url.Values, userID, since string) {
	bad := func(field, detail string) {
		problem.Write(w, r, problem.New(http.StatusBadRequest, problem.InvalidQuery, detail).On(field))
	}
	limit := feed.DefaultLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > feed.MaxLimit {
			bad("limit", "limit must be a whole number from 1 to "+strconv.Itoa(feed.MaxLimit))
			return
		}
		limit = n
	}
	if q.Has("cursor") || q.Has("unread") || q.Has("status") {
		bad("since", "since reads what is new in commit order; it does not combine with cursor, unread or status")
		return
	}
	after, err := live.ParseCursor(since)
	if err != nil {
		problem.Write(w, r, problem.New(http.StatusBadRequest, problem.InvalidCursor, "since is not a refresh cursor this server issued; load the first page again").On("since"))
		return
	}
	ctx, cancel := s.dbContext(r)
	defer cancel()
	changes, err := live.Since(ctx, s.cfg.DB, userID, after, limit)
	if errors.Is(err, live.ErrOtherHistory) {
		problem.Write(w, r, problem.New(http.StatusBadRequest, problem.InvalidCursor,
			"since is from another history of the database (it was restored or failed over): load the first page again").On("since"))
		return
	}
	if err != nil {
		s.dbError(w, r, "read changes", err)
		return
	}
	end := changes.End.String()
	if changes.More {
		link := url.Values{"limit": {strconv.Itoa(limit)}, "since": {end}}
		w.Header().Add("Link", "<"+r.URL.Path+"?"+link.Encode()+`>; rel="next"`)
	}
	writePageBody(w, changes.Items, changes.More, nil, &end)
}

// adminListNotifications shows any user's feed to an admin, for support.
func (s *Server) adminListNotifications(w http.ResponseWriter, r *http.Request, ps httprouter.Params, _ auth.User) {
	s.writePage(w, r, r.URL.Query(), ps.ByName("user"), false)
}

// writePage answers a page of userID's feed, with its refresh cursor when
// refresh is set (a first page: no cursor).
func (s *Server) writePage(w http.ResponseWriter, r *http.Request, values url.Values, userID string, refresh bool) {
	q, p := pageQuery(values, userID)
	if p != nil {
		problem.Write(w, r, *p)
		return
	}
	q.Refresh = refresh
	ctx, cancel := s.dbContext(r)
	defer cancel()
	var page feed.Page
	err := s.readFeed(ctx, r, userID, func(ctx context.Context, db feed.DB, _ bool) (err error) {
		page, err = s.feed.On(db).Page(ctx, q)
		return err
	})
	if err != nil {
		s.dbError(w, r, "read feed", err)
		return
	}
	var next, refreshCursor *string
	if c := page.Refresh; c != nil {
		text := live.Cursor{Position: live.Position{Tx: c.Tx, ID: c.ID}, At: c.At, History: c.History, WAL: c.WAL, Synchronous: c.Synchronous}.String()
		refreshCursor = &text
	}
	if page.HasMore {
		text := page.Next.Encode()
		next = &text
		link := url.Values{"limit": {strconv.Itoa(q.Limit)}, "cursor": {text}}
		if q.Status != feed.All {
			link.Set("status", q.Status.String())
		}
		// Add, not Set: a deprecated version's Link rel="deprecation" stays.
		w.Header().Add("Link", "<"+r.URL.Path+"?"+link.Encode()+`>; rel="next"`)
	}
	writePageBody(w, page.Items, page.HasMore, next, refreshCursor)
}

// markState is POST /v1/notifications/{id}/read, unread, archive and
// unarchive: the change of one notification's state that mark makes.
func (s *Server) markState(what string, mark func(st *feed.Store, ctx context.Context, user string, id feed.ID) error) userHandler {
	return func(w http.ResponseWriter, r *http.Request, ps httprouter.Params, u auth.User) {
		ctx, cancel := s.dbContext(r)
		defer cancel()
		id, err := feed.ParseID(ps.ByName("id"))
		if err == nil {
			err = mark(s.feed, ctx, u.ID, id)
		}
		switch {
		case errors.Is(err, feed.ErrNotFound):
			problem.Write(w, r, problem.New(http.StatusNotFound, problem.NotFound, "no such notification"))
		case err != nil:
			s.dbError(w, r, what, err)
		default:
			s.wrote(ctx, w, r, u.ID)
			w.WriteHeader(http.StatusNoContent)
		}
	}
}

// markAll is POST /v1/notifications/read-all and archive-all (the :id of
// the one-segment route: httprouter cannot hold both beside :id/read).
func (s *Server) markAll(w http.ResponseWriter, r *http.Request, ps httprouter.Params, u auth.User) {
	mark, field := (*feed.Store).MarkAllRead, "read_through"
	switch ps.ByName("id") {
	case "read-all":
	case "archive-all":
		mark, field = (*feed.Store).MarkAllArchived, "archived_through"
	default:
		problem.Write(w, r, problem.New(http.StatusNotFound, problem.NotFound, "no route for "+r.URL.Path))
		return
	}
	ctx, cancel := s.dbContext(r)
	defer cancel()
	through, ok, err := mark(s.feed, ctx, u.ID)
	if err != nil {
		s.dbError(w, r, ps.ByName("id"), err)
		return
	}
	s.wrote(ctx, w, r, u.ID)
	// The id of the newest notification it covers; null for an empty feed.
	out := map[string]*string{field: nil}
	if ok {
		id := through.String()
		out[field] = &id
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
}

func (s *Server) unreadCount(w http.ResponseWriter, r *http.Request, _ httprouter.Params, u auth.User) {
	ctx, cancel := s.dbContext(r)
	defer cancel()
	var n int
	var capped bool
	err := s.readFeed(ctx, r, u.ID, func(ctx context.Context, db feed.DB, _ bool) (err error) {
		n, capped, err = s.feed.On(db).UnreadCount(ctx, u.ID)
		return err
	})
	if err != nil {
		s.dbError(w, r, "unread count", err)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, map[string]any{"count": n, "capped": capped})
}

// counts is GET /v1/notifications/counts: unread and unseen, and archived
// with ?archived=true, each capped as the unread count is.
func (s *Server) counts(w http.ResponseWriter, r *http.Request, _ httprouter.Params, u auth.User) {
	archived := false
	switch r.URL.Query().Get("archived") {
	case "", "false":
	case "true":
		archived = true
	default:
		problem.Write(w, r, problem.New(http.StatusBadRequest, problem.InvalidQuery, "archived must be true or false").On("archived"))
		return
	}
	ctx, cancel := s.dbContext(r)
	defer cancel()
	var c feed.Counts
	err := s.readFeed(ctx, r, u.ID, func(ctx context.Context, db feed.DB, _ bool) (err error) {
		c, err = s.feed.On(db).Counts(ctx, u.ID, archived)
		return err
	})
	if err != nil {
		s.dbError(w, r, "counts", err)
		return
	}
	out := map[string]any{"unread": c.Unread, "unseen": c.Unseen}
	if c.Archived != nil {
		out["archived"] = *c.Archived
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
}
