package fcm

import (
	"net/http"
	"testing"

	"github.com/spoolcast/spoolcast/channel"
	"github.com/spoolcast/spoolcast/internal/clock"
)

func TestAnAnswerThatIsNotGooglesJSONIsReadByItsStatus(t *testing.T) {
	t.Parallel()
	c := &Channel{cfg: Config{Clock: clock.Real{}}}
	for _, tc := range []struct {
		status int
		body   string
		want   channel.Outcome
	}{
		{502, "<html>Bad Gateway</html>", channel.Outcome{Kind: channel.Unknown, Status: 502, Reason: "FCM 502: <html>Bad Gateway</html>"}}, // a front end may hide a request FCM took
		{429, "", channel.Outcome{Kind: channel.RetryAfter, Status: 429, Reason: "FCM 429: Too Many Requests"}},
		{401, "", channel.Outcome{Kind: channel.RetryAfter, Status: 401, Credentials: true, Reason: "FCM 401: Unauthorized"}},
		{404, "", channel.Outcome{Kind: channel.Failed, Status: 404, Reason: "FCM 404: Not Found"}},
		{200, "not json", channel.Outcome{Kind: channel.Delivered, Status: 200}},
	} {
		if got, _ := c.answer(tc.status, http.Header{}, []byte(tc.body)); got != tc.want {
			t.Errorf("%d %q:\n got %+v\nwant %+v", tc.status, tc.body, got, tc.want)
		}
	}
}
