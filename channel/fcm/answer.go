package fcm

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/spoolcast/spoolcast/channel"
	"github.com/spoolcast/spoolcast/internal/retryafter"
)

const (
	// quotaWait is RetryAfter's Wait after QUOTA_EXCEEDED without a
	// Retry-After: FCM's ErrorCode reference asks for backoff "with a
	// minimum initial delay of 1 minute" there.
	quotaWait = time.Minute
	// maxReason caps the provider's words kept in Outcome.Reason.
	maxReason = 300
)

// errorBody is an error answer of Google's APIs, with FCM's details.
type errorBody struct {
	Error struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
		Status  string `json:"status"`
		Details []struct {
			Type            string `json:"@type"`
			ErrorCode       string `json:"errorCode"` // FcmError
			FieldViolations []struct {
				Field string `json:"field"`
			} `json:"fieldViolations"` // google.rpc.BadRequest
		} `json:"details"`
	} `json:"error"`
}

// answer is the outcome FCM's answer says, as the package comment's table
// has it. unauthenticated: FCM refused the access token itself.
func (c *Channel) answer(status int, header http.Header, body []byte) (o channel.Outcome, unauthenticated bool) {
	if status == http.StatusOK {
		var ok struct {
			Name string `json:"name"`
		}
		_ = json.Unmarshal(body, &ok) // a 200 is FCM's taking it, whatever its body
		return channel.Outcome{Kind: channel.Delivered, ID: ok.Name, Status: status}, false
	}

	var e errorBody
	parsed := json.Unmarshal(body, &e) == nil && e.Error.Status != ""
	code, message, namesToken := "", strings.TrimSpace(string(body)), false
	if parsed {
		code, message = e.Error.Status, e.Error.Message
		for _, d := range e.Error.Details {
			if d.ErrorCode != "" {
				code = d.ErrorCode // FCM's own code says more than the status
			}
			for _, v := range d.FieldViolations {
				namesToken = namesToken || v.Field == "message.token"
			}
		}
		// FCM refuses a token that is not one with no field violation,
		// only these words: "The registration token is not a valid FCM
		// registration token".
		namesToken = namesToken || strings.Contains(strings.ToLower(message), "registration token")
	}
	if message == "" {
		message = http.StatusText(status)
	}
	o = channel.Outcome{Status: status, Code: code, Reason: reason(status, code, message)}
	wait, waitSaid := retryafter.Parse(header.Get("Retry-After"), c.cfg.Clock.Now())

	switch {
	case code == "UNREGISTERED":
		o.Kind = channel.TokenGone
	case code == "SENDER_ID_MISMATCH":
		// The token is another Firebase project's app's: disabled. With
		// the wrong --fcm-credentials-file every device answers so, which
		// the dispatcher's refusal guard tells.
		o.Kind = channel.TokenForeign
	case code == "INVALID_ARGUMENT" && namesToken:
		o.Kind = channel.TokenInvalid
	case code == "THIRD_PARTY_AUTH_ERROR" || code == "APNS_AUTH_ERROR": // the latter its older name
		o.Kind, o.Credentials = channel.Failed, true
	case code == "QUOTA_EXCEEDED":
		o.Kind, o.Wait = channel.RetryAfter, wait
		if !waitSaid {
			o.Wait = quotaWait
		}
	case code == "UNAUTHENTICATED" || code == "PERMISSION_DENIED" ||
		status == http.StatusUnauthorized || status == http.StatusForbidden:
		o.Kind, o.Wait, o.Credentials = channel.RetryAfter, wait, true
		unauthenticated = status == http.StatusUnauthorized
	case code == "UNAVAILABLE" || code == "INTERNAL" || code == "RESOURCE_EXHAUSTED" ||
		status == http.StatusTooManyRequests || status == http.StatusInternalServerError || status == http.StatusServiceUnavailable:
		o.Kind, o.Wait = channel.RetryAfter, wait
	case status >= 500:
		// A 502 or 504 from a front end may hide a request FCM took.
		o.Kind = channel.Unknown
	default:
		// INVALID_ARGUMENT about anything but the token, NOT_FOUND
		// without UNREGISTERED (a wrong project: no token is to blame),
		// UNSPECIFIED_ERROR, any other refusal.
		o.Kind = channel.Failed
	}
	return o, unauthenticated
}

// reason is FCM's answer for the delivery log:
// "FCM 404 UNREGISTERED: Requested entity was not found."
func reason(status int, code, message string) string {
	message = strings.ToValidUTF8(message, "")
	if len(message) > maxReason {
		message = channel.Shorten(message, maxReason)
	}
	if code == "" {
		return fmt.Sprintf("FCM %d: %s", status, message)
	}
	return fmt.Sprintf("FCM %d %s: %s", status, code, message)
}
