package central

// This file holds where a feed read goes, the read replica or the primary,
// and the read-your-writes contract that decides it.
//
// Feed pages, unread counts and the admin delivery log read from
// Config.ReadDB while it is current; writes, the since read and the live
// stream stay on the primary. A write a user makes (mark read, read-all) is
// answered with the WAL position the primary stood at after its commit,
// twice: as the header Spoolcast-Written-At and as the cookie spoolcast_lsn
// (Path=/v1, HttpOnly, SameSite=Strict, Secure over HTTPS; Max-Age the
// read-your-writes window). A read carrying a position, in either (the
// newest counts), or made by a user who wrote through this central replica
// within the window, goes to the replica only once it has replayed that
// position, checked on the connection the read then uses; else to the
// primary. So the next page or count shows the write whichever central
// replica answers it.

import (
	"context"
	"errors"
	"math"
	"net/http"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/spoolcast/spoolcast/feed"
)

// The names of the write position a client carries back.
const (
	WrittenAtHeader = "Spoolcast-Written-At"
	WrittenAtCookie = "spoolcast_lsn"
)

// The statements of the read-your-writes contract. The position is read
// after the write's commit, in a statement of its own: inside the write's
// transaction it would be a position before its commit record, one a
// standby can have replayed without showing the write. It is the insert
// position, which is past the commit record even when the commit did not
// wait for its flush (synchronous_commit=off); at worst it lies a page
// header past it, and the write's reads go to the primary until the next
// record is replayed. The check runs in a statement of its own before the
// read's: a read's snapshot is taken as it starts, so a check inside it
// could pass on a record replayed after.
const (
	writtenAtSQL = `SELECT pg_current_wal_insert_lsn()::text`
	replayedSQL  = `SELECT coalesce(CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END >= $1::pg_lsn, false)`
)

// readFeed runs read on the replica when it may answer it, else on the
// primary (see the file's comment). read may run twice, on the replica and
// then the primary: it must not answer the request itself, and must set
// what it returns afresh each time.
func (s *Server) readFeed(ctx context.Context, r *http.Request, feedOf string, read func(ctx context.Context, db feed.DB, onReplica bool) error) error {
	if s.replica == nil {
		s.metrics.feedReads.WithLabelValues("primary", reasonNoReplica).Inc()
		return read(ctx, s.cfg.DB, false)
	}
	onReplica, reason := s.replica.route()
	if onReplica {
		need, ok := s.mustSee(r, feedOf)
		switch {
		case !ok, need == unknownLSN: // a write whose position is not known is never replayed
			reason = reasonUnreplayed
		default:
			var served bool
			served, reason = s.readReplica(ctx, need, reason, read)
			if served {
				s.metrics.feedReads.WithLabelValues("replica", reason).Inc()
				return nil
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
		}
	}
	s.metrics.feedReads.WithLabelValues("primary", reason).Inc()
	return read(ctx, s.cfg.DB, false)
}

// readReplica runs read in one read-only transaction on the replica, so
// that the check of the position and every statement of the read reach
// the same server (through PgBouncer, and when the URL names several), in
// at most half the request's budget: the primary gets the rest when it
// fails.
func (s *Server) readReplica(ctx context.Context, need lsn, reason string, read func(ctx context.Context, db feed.DB, onReplica bool) error) (served bool, why string) {
	rctx, cancel := context.WithTimeout(ctx, s.cfg.DBTimeout/2)
	defer cancel()
	failed := func(err error) (bool, string) {
		if ctx.Err() == nil {
			if !errors.As(err, new(*pgconn.PgError)) {
				s.replica.unreachable() // no answer: refused, reset, or hung past its budget
			}
			s.dbLog.Do(func(suppressed int64) {
				s.log.Warn("the read replica failed a read; asking the primary", "err", err, "suppressed", suppressed)
			})
		}
		return false, reasonReplicaFailed
	}
	tx, err := s.cfg.ReadDB.BeginTx(rctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		return failed(err)
	}
	// Read only: nothing to commit. Past its budget, the rollback closes the
	// connection, as it should one that hung.
	defer func() { _ = tx.Rollback(rctx) }()
	if need > 0 {
		var replayed bool
		if err := tx.QueryRow(rctx, replayedSQL, need.String()).Scan(&replayed); err != nil {
			return failed(err)
		}
		if !replayed {
			return false, reasonUnreplayed
		}
		reason = reasonReplayed
	}
	if err := read(rctx, tx, true); err != nil {
		return failed(err)
	}
	return true, reason
}

// mustSee is the newest write position a read of feedOf must show: the one
// the request carries in the header or the cookie, or the one this central
// replica remembers for that user; 0 for none. ok is false when the request
// carries one that does not parse: the read goes to the primary rather
// than guess.
func (s *Server) mustSee(r *http.Request, feedOf string) (need lsn, ok bool) {
	need = s.positions.lookup(feedOf)
	var values []string
	for _, v := range r.Header.Values(WrittenAtHeader) {
		values = append(values, strings.Split(v, ",")...)
	}
	for _, c := range r.CookiesNamed(WrittenAtCookie) {
		values = append(values, c.Value)
	}
	for _, v := range values {
		at, err := parseLSN(strings.TrimSpace(v))
		if err != nil {
			return 0, false
		}
		need = max(need, at)
	}
	return need, true
}

// wrote tells the client where the user's write committed, after it has:
// the header and the cookie, and this replica remembers it for the user.
// Without a replica nothing reads elsewhere, and nothing is sent. When the
// position cannot be read, the write still answers as it did; its reads
// go to the primary for the window.
func (s *Server) wrote(ctx context.Context, w http.ResponseWriter, r *http.Request, userID string) {
	if s.replica == nil {
		return
	}
	at := unknownLSN
	var text string
	if err := s.cfg.DB.QueryRow(ctx, writtenAtSQL).Scan(&text); err == nil {
		if p, err := parseLSN(text); err == nil {
			at = p
		}
	}
	s.positions.record(userID, at)
	w.Header().Set(WrittenAtHeader, at.String())
	http.SetCookie(w, &http.Cookie{
		Name: WrittenAtCookie, Value: at.String(), Path: "/v1",
		MaxAge:   int(math.Ceil(s.positions.ttl.Seconds())),
		HttpOnly: true, SameSite: http.SameSiteStrictMode,
		Secure: r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https"),
	})
}
