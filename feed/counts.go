package feed

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// Count is a capped count: N up to UnreadCap, Capped when there are more.
type Count struct {
	N      int  `json:"count"`
	Capped bool `json:"capped"`
}

// Counts are a user's counts of the inbox, each capped at UnreadCap.
type Counts struct {
	// Unread counts the "unread" tab: neither read nor archived.
	Unread Count
	// Unseen counts the notifications not archived that the seen position
	// does not cover.
	Unseen Count
	// Archived counts the "archived" tab, when asked for.
	Archived *Count
}

// tally is one of the counts a read makes: its branches, and its rows so far.
type tally struct {
	branches []branch
	n        int
}

// Counts counts the user's unread and unseen notifications, and archived
// ones with archived, each up to UnreadCap. It never counts a whole feed:
// each count reads its tab's index ranges (tabs.go) no further than
// UnreadCap+1 rows. One statement reads the newest partitions by name for
// every count; only a count below the cap whose ranges may reach the weeks
// before them (by the watermarks it read) has a second statement read
// those, from as far back as its ranges may lie.
func (s *Store) Counts(ctx context.Context, userID string, archived bool) (Counts, error) {
	cs := []*tally{{branches: tabBranches(Unread)}, {branches: unseenBranches()}}
	if archived {
		cs = append(cs, &tally{branches: tabBranches(Archived)})
	}
	if err := s.count(ctx, userID, cs); err != nil {
		return Counts{}, err
	}
	capped := func(c *tally) Count {
		if c.n > UnreadCap {
			return Count{N: UnreadCap, Capped: true}
		}
		return Count{N: c.n}
	}
	out := Counts{Unread: capped(cs[0]), Unseen: capped(cs[1])}
	if archived {
		a := capped(cs[2])
		out.Archived = &a
	}
	return out, nil
}

// UnreadCount counts the user's unread notifications (neither read nor
// archived) up to UnreadCap; capped is true when there are more. It reads
// as Counts does.
func (s *Store) UnreadCount(ctx context.Context, userID string) (count int, capped bool, err error) {
	c := &tally{branches: tabBranches(Unread)}
	if err := s.count(ctx, userID, []*tally{c}); err != nil {
		return 0, false, err
	}
	if c.n > UnreadCap {
		return UnreadCap, true, nil
	}
	return c.n, false, nil
}

func (s *Store) count(ctx context.Context, userID string, cs []*tally) error {
	now := s.clock.Now()
	err := s.countOnce(ctx, userID, cs, now)
	if undefinedTable(err) { // a partition dropped since it was looked up: once more, looked up again
		for _, c := range cs {
			c.n = 0
		}
		err = s.countOnce(ctx, userID, cs, now)
	}
	if err != nil {
		return fmt.Errorf("count: %w", err)
	}
	return nil
}

func (s *Store) countOnce(ctx context.Context, userID string, cs []*tally, now time.Time) error {
	named, rest, err := s.spans(ctx, now.Add(FutureSlack), now)
	if err != nil {
		return err
	}
	spans := make([][]span, len(cs))
	branches := make([][]branch, len(cs))
	for i, c := range cs {
		for _, sp := range named {
			for _, b := range c.branches {
				branches[i], spans[i] = append(branches[i], b), append(spans[i], sp)
			}
		}
	}
	marks, err := s.countSpans(ctx, userID, cs, branches, spans)
	if undefinedTable(err) {
		s.forget(named)
	}
	if err != nil {
		return err
	}
	// The weeks before the named ones, for the counts below the cap whose
	// ranges may reach them.
	var more []*tally
	branches, spans = branches[:0], spans[:0]
	for _, c := range cs {
		if c.n > UnreadCap {
			continue
		}
		if bs, sps := restSpans(c.branches, marks, *rest.before); len(bs) > 0 {
			more, branches, spans = append(more, c), append(branches, bs), append(spans, sps)
		}
	}
	if len(more) == 0 {
		return nil
	}
	_, err = s.countSpans(ctx, userID, more, branches, spans)
	return err
}

// countSpans adds to each count the rows of its branches, each over its
// span, in one statement that reads them in turn and no further than the
// cap allows, and returns the watermarks' times.
func (s *Store) countSpans(ctx context.Context, userID string, cs []*tally, branches [][]branch, spans [][]span) (markTimes, error) {
	args := queryArgs{userID}
	var slack string
	counts := make([]string, len(cs))
	for i, c := range cs {
		limit := args.add(UnreadCap + 1 - c.n)
		parts := make([]string, len(branches[i]))
		for j, b := range branches[i] {
			parts[j] = branchSQL(b, spans[i][j], `SELECT 1`, &args, &slack, nil) + ` LIMIT ` + limit
		}
		rows := parts[0]
		if len(parts) > 1 {
			rows = `(` + strings.Join(parts, `) UNION ALL (`) + `) LIMIT ` + limit
		}
		counts[i] = `(SELECT count(*) FROM (` + rows + `) c)`
	}
	sql := `WITH m AS MATERIALIZED ` + Marks + ` SELECT ` + markTimesColumns + `, ` + strings.Join(counts, `, `) + ` FROM m`
	var marks markTimes
	ns := make([]int, len(cs))
	dest := marks.targets()
	for i := range ns {
		dest = append(dest, &ns[i])
	}
	if err := s.db.QueryRow(ctx, sql, s.args(args)...).Scan(dest...); err != nil {
		return markTimes{}, err
	}
	for i, c := range cs {
		c.n += ns[i]
	}
	return marks, nil
}
