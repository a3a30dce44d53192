package main

// Devices the providers refuse one by one, registered beside the users'
// own: a token of another app at each provider (APNs
// DeviceTokenNotForTopic, FCM SENDER_ID_MISMATCH, an Expo token of another
// project, which makes Expo refuse each request it joins whole), an iPhone
// whose APNs answers 410 as of a time before it registered again, and an
// Expo phone whose first receipts say MessageRateExceeded. Each may end
// its own pushes and disable its own device, never another's, and none of
// them is the deployment's fault, so none counts for the credentials alert.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/spoolcast/spoolcast/channel/apns/apnstest"
	"github.com/spoolcast/spoolcast/channel/fcm/fcmtest"
)

// strays are the planted devices.
type strays struct {
	foreign      map[string]string // token → the user it is registered to: another app's
	reregistered string            // APNs answers 410 as of before it registered
	rateLimited  string            // its first receipts say MessageRateExceeded
}

// rateLimitedReceipts is how many of the rate-limited phone's receipts
// say MessageRateExceeded: its push is sent again a minute later, within
// the self-check's minute of settling.
const rateLimitedReceipts = 1

// plantStrays registers the stray devices through central, as apps
// would, and tells the fakes how to answer them.
func plantStrays(ctx context.Context, w *world, apps []*app, base string) error {
	hexToken := func(s string) string { sum := sha256.Sum256([]byte(s)); return hex.EncodeToString(sum[:]) }
	st := strays{foreign: map[string]string{}, reregistered: hexToken("chaos-reregistered"), rateLimited: "ExponentPushToken[" + apps[4].user + "]"}
	apnsStray, fcmStray, expoStray := hexToken("chaos-another-app"), "chaos:"+hexToken("chaos-another-sender"), "ExponentPushToken[another-project]"
	w.channels.apns.Answer(apnsStray, apnstest.Reply{Status: http.StatusBadRequest, Reason: "DeviceTokenNotForTopic"})
	w.channels.fcm.FailToken(fcmStray, fcmtest.SenderIDMismatch)
	w.expo.SetExperience(expoStray, "@another/app")
	// Apple's last word that the token was invalid came before the phone
	// registered it again (reinstalled): a newer token, never disabled.
	w.channels.apns.Answer(st.reregistered, apnstest.Reply{Status: http.StatusGone, Reason: "Unregistered", Timestamp: time.Now().Add(-time.Hour)})
	w.expo.ExceedRateAtReceipt(st.rateLimited, rateLimitedReceipts)
	for _, d := range []struct {
		a     *app
		token string
		body  string
	}{
		{apps[0], apnsStray, fmt.Sprintf(`{"token":%q,"platform":"ios","provider":"apns"}`, apnsStray)},
		{apps[1], fcmStray, fmt.Sprintf(`{"token":%q,"platform":"android","provider":"fcm"}`, fcmStray)},
		{apps[2], expoStray, fmt.Sprintf(`{"token":%q,"platform":"ios"}`, expoStray)},
		{apps[3], st.reregistered, fmt.Sprintf(`{"token":%q,"platform":"ios","provider":"apns"}`, st.reregistered)},
	} {
		if status, body := d.a.call(ctx, http.MethodPut, base+"/v1/devices", d.body); status != http.StatusOK && status != http.StatusCreated {
			return fmt.Errorf("register %s's stray device: %d %s", d.a.user, status, body)
		}
		if d.token != st.reregistered {
			st.foreign[d.token] = d.a.user
		}
	}
	w.strays = st
	return nil
}

// final reports whether a failed push to token for reason is the
// provider's final word on a planted device.
func (st strays) final(token, reason string) bool {
	switch {
	case st.foreign[token] != "":
		return strings.Contains(reason, "the token is disabled")
	case token == st.reregistered:
		return strings.HasPrefix(reason, "APNs 410")
	}
	return false
}

// checkRefusals: each device of another app is disabled as such, the
// iPhone registered again after its 410's timestamp is not, no other
// device is disabled for being another app's, and no replica counted a
// refusal of the deployment's credentials or held one for most devices
// refusing (none of those was planted).
func checkRefusals(ctx context.Context, db *pgx.Conn, w *world, s *sampler) ([]invariant, error) {
	st := w.strays
	rows, err := db.Query(ctx, `SELECT token, enabled, coalesce(disabled_reason, '') FROM devices WHERE disabled_reason = 'another_app' OR token = ANY($1)`,
		append(keys(st.foreign), st.reregistered))
	if err != nil {
		return nil, err
	}
	disabled, wrongly := 0, 0
	reregisteredOn := false
	var notes []string
	for rows.Next() {
		var token, reason string
		var enabled bool
		if err := rows.Scan(&token, &enabled, &reason); err != nil {
			rows.Close()
			return nil, err
		}
		switch {
		case token == st.reregistered:
			reregisteredOn = enabled
		case st.foreign[token] != "" && !enabled && reason == "another_app":
			disabled++
		case st.foreign[token] != "":
			notes = append(notes, fmt.Sprintf("%s enabled %v, %q", shorten(token, 24), enabled, reason))
		default:
			wrongly++
			notes = append(notes, fmt.Sprintf("%s disabled as another app's", shorten(token, 24)))
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	gone := 0
	for _, r := range w.channels.apns.Requests() {
		if r.Token == st.reregistered && r.Status == http.StatusGone {
			gone++
		}
	}
	credentials, held := s.totals()
	return []invariant{
		{"a device's refusal disabled that device alone, and paged no one", disabled == len(st.foreign) && wrongly == 0 && reregisteredOn && gone > 0 && credentials == 0 && held == 0,
			fmt.Sprintf("%d of %d devices of another app disabled as such; %d others disabled so; the iPhone registered again after its 410's timestamp enabled: %v (%d pushes answered 410); credentials refusals counted %v, refusals held %v (summed over every replica's lives); %s",
				disabled, len(st.foreign), wrongly, reregisteredOn, gone, credentials, held, strings.Join(notes, "; "))},
	}, nil
}

func keys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
