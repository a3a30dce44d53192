package feed_test

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/feed"
)

// pageDocument is the page as the API documents it, for encoding/json.
type pageDocument struct {
	Data          []feed.Item `json:"data"`
	HasMore       bool        `json:"has_more"`
	NextCursor    *string     `json:"next_cursor"`
	RefreshCursor *string     `json:"refresh_cursor,omitempty"`
}

// FuzzPageJSONMatchesEncodingJSON holds AppendPageJSON to what
// encoding/json's Encoder (as httpapi.WriteJSON sends JSON) makes of the
// same page, byte for byte, for any strings and times and any valid data.
func FuzzPageJSONMatchesEncodingJSON(f *testing.F) {
	f.Add("job.finished", "jobs", "Nightly export finished", "Your export of 12,345 rows is ready.", []byte(`{"rows": 12345, "job_id": "j_1", "url": "https://example.com/e/1"}`), "bench", int64(1764590000), int64(123456000), 0, true, true, false)
	f.Add("t", "", "<b>5 > 4 & 3</b>", "line\nbreak\ttab \"quoted\" \\ \u2028\u2029 é 日本", []byte(`{"html": "<script>&amp;</script>", "sep": "\u2028 \u2029", "s": "a\"b\\"}`), "p", int64(0), int64(0), -330, false, false, true)
	f.Add("\x00\x1f\x7f", "\xff\xfe", "bad \xc3\x28 utf8", "", []byte(` [ 1 , 2.5e3 , { "y" : null , "x" : true } , "  spaced  " ] `), "", int64(253402214399), int64(999999999), 1439, true, false, true)
	f.Add("a", "b", "c", "d", []byte(`"just a string"`), "e", int64(1000000000), int64(1), 60, false, true, true)
	f.Add("a", "b", "c", "d", []byte{}, "e", int64(1), int64(1), 0, false, false, false)
	f.Fuzz(func(t *testing.T, typ, category, title, body string, data []byte, producer string, sec, nsec int64, offsetMinutes int, read, hasMore, refresh bool) {
		if len(data) > 0 && !json.Valid(data) {
			return // Postgres sends valid jsonb only
		}
		// Times Postgres can hold and time.Time.MarshalJSON encodes.
		sec = ((sec % 253402214400) + 253402214400) % 253402214400 // to 9999-12-31, in any zone
		nsec = ((nsec % 1e9) + 1e9) % 1e9
		zone := time.FixedZone("z", (offsetMinutes%1440)*60)
		at := time.Unix(sec, nsec).In(zone)
		n := feed.Notification{ID: sec%1000 + 1, Type: typ, Category: category, Title: title, Body: body, Data: data, Producer: producer, CreatedAt: at}
		if len(data) == 0 {
			n.Data = nil // NOT NULL in Postgres; a missing one encodes as null
		}
		received := at.Add(-time.Duration(nsec))
		n.ReceivedAt = &received
		if read {
			readAt := at.UTC().Add(time.Minute)
			n.ReadAt = &readAt
			seenAt := at.Add(time.Second)
			n.SeenAt = &seenAt
		} else {
			archivedAt := at.UTC().Add(time.Hour)
			n.ArchivedAt = &archivedAt
		}
		other := n
		other.ID, other.Title, other.ReceivedAt = n.ID+1, body, nil
		items := []feed.Notification{n, other}

		next, cursor := (*string)(nil), "MjAyNi0xMS0zMFQwOTowMDowMFp8MQ"
		if hasMore {
			next = &cursor
		}
		var refreshCursor *string
		if refresh {
			c := "AwAAAAAAAAMMAAAAAAAAAA8ABkfN_1yQdgAAAAAAAAAAAA" + title // any string
			refreshCursor = &c
		}

		doc := pageDocument{Data: []feed.Item{n.Item(), other.Item()}, HasMore: hasMore, NextCursor: next, RefreshCursor: refreshCursor}
		var want bytes.Buffer
		if err := json.NewEncoder(&want).Encode(doc); err != nil {
			t.Fatalf("encoding/json: %v", err)
		}
		got := feed.AppendPageJSON(nil, items, hasMore, next, refreshCursor)
		if !bytes.Equal(got, want.Bytes()) {
			t.Fatalf("AppendPageJSON differs from encoding/json:\n got %s\nwant %s", got, want.Bytes())
		}
		if got := feed.AppendPageJSON(nil, nil, false, nil, nil); string(got) != "{\"data\":[],\"has_more\":false,\"next_cursor\":null}\n" {
			t.Fatalf("an empty page = %s", got)
		}
	})
}
