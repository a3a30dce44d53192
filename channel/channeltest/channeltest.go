// Package channeltest starts a fake APNs and a fake FCM, and the real
// channels to them, for tests of what sends through the channels (the
// dispatcher, device registration).
package channeltest

import (
	"path/filepath"
	"testing"

	"github.com/spoolcast/spoolcast/channel"
	"github.com/spoolcast/spoolcast/channel/apns"
	"github.com/spoolcast/spoolcast/channel/apns/apnstest"
	"github.com/spoolcast/spoolcast/channel/fcm"
	"github.com/spoolcast/spoolcast/channel/fcm/fcmtest"
)

// Rig is the two fakes and the channels to them, APNs first.
type Rig struct {
	APNs     *apnstest.Server
	FCM      *fcmtest.Server
	Channels []channel.Channel
}

// Start starts the fakes and the channels, all closed when t ends.
func Start(t testing.TB) *Rig {
	t.Helper()
	key := apnstest.NewKey()
	fakeAPNs := apnstest.New("KEY1234567", "TEAM123456", &key.PublicKey)
	t.Cleanup(fakeAPNs.Close)
	a, err := apns.New(apns.Config{Key: key, KeyID: "KEY1234567", TeamID: "TEAM123456", Topic: "com.example.app",
		Host: fakeAPNs.URL(), RootCAs: fakeAPNs.CertPool()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	fakeFCM, err := fcmtest.Start(fcmtest.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fakeFCM.Close() })
	creds := filepath.Join(t.TempDir(), "service-account.json")
	if err := fakeFCM.WriteCredentials(creds); err != nil {
		t.Fatal(err)
	}
	f, err := fcm.New(fcm.Config{CredentialsFile: creds, Endpoint: fakeFCM.URL()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	return &Rig{APNs: fakeAPNs, FCM: fakeFCM, Channels: []channel.Channel{a, f}}
}
