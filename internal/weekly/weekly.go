// Package weekly names the weekly partitions of spoolcast's partitioned
// tables the way migration 004's spoolcast_ensure_week_partition makes them:
// weeks start Monday 00:00 UTC, and a partition is <table>_YYYYMMDD of its
// first day.
package weekly

import "time"

// Start returns the Monday 00:00 UTC that begins t's week, as Postgres's
// date_trunc('week') does.
func Start(t time.Time) time.Time {
	t = t.UTC()
	d := time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
	return d.AddDate(0, 0, -((int(d.Weekday()) + 6) % 7))
}

// Partition returns the name of table's partition that holds t.
func Partition(table string, t time.Time) string {
	return table + "_" + Start(t).Format(layout)
}

// ParsePartition returns the first day of a partition of table named name,
// and false for a name that is not one.
func ParsePartition(table, name string) (time.Time, bool) {
	if len(name) != len(table)+1+len(layout) || name[:len(table)+1] != table+"_" {
		return time.Time{}, false
	}
	start, err := time.Parse(layout, name[len(table)+1:])
	return start, err == nil && Start(start).Equal(start)
}

const layout = "20060102"
