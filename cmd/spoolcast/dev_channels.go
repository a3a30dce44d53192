package main

import (
	"fmt"
	"log/slog"
	"path/filepath"

	"github.com/spoolcast/spoolcast/channel/apns/apnstest"
	"github.com/spoolcast/spoolcast/channel/fcm/fcmtest"
	"github.com/spoolcast/spoolcast/push"
)

// The dev stack's APNs identity: its fake trusts this key id and team.
const (
	devAPNsKeyID  = "DEVKEY0001"
	devAPNsTeamID = "DEVTEAM001"
	devAPNsTopic  = "dev.spoolcast.app"
)

// startFakeChannels serves a fake APNs (TLS, HTTP/2) and a fake FCM with
// its token endpoint on loopback, and returns the channel flags that send
// to them, so the dev stack takes devices of all four providers without a
// real device or account. The keys are new at each start, kept in dataDir.
func startFakeChannels(dataDir string, logger *slog.Logger) (channelFlags, func(), error) {
	key := apnstest.NewKey()
	keyFile := filepath.Join(dataDir, "apns-dev.p8")
	if err := apnstest.WriteP8(keyFile, key); err != nil {
		return channelFlags{}, nil, fmt.Errorf("fake APNs key: %w", err)
	}
	fakeAPNs := apnstest.New(devAPNsKeyID, devAPNsTeamID, &key.PublicKey)
	fakeFCM, err := fcmtest.Start(fcmtest.Config{})
	if err != nil {
		fakeAPNs.Close()
		return channelFlags{}, nil, fmt.Errorf("fake FCM: %w", err)
	}
	log := logger.With("component", "fake-fcm")
	fakeFCM.SetOnMessage(func(m fcmtest.Message) {
		title := ""
		if m.Notification != nil {
			title = m.Notification.Title
		}
		log.Info("push delivered to the fake FCM", "to", push.MaskToken(m.Token), "title", title)
	})
	stop := func() { fakeAPNs.Close(); _ = fakeFCM.Close() }
	credentials := filepath.Join(dataDir, "fcm-dev.json")
	if err := fakeFCM.WriteCredentials(credentials); err != nil {
		stop()
		return channelFlags{}, nil, fmt.Errorf("fake FCM credentials: %w", err)
	}
	return channelFlags{
		apnsKeyFile: keyFile, apnsKeyID: devAPNsKeyID, apnsTeamID: devAPNsTeamID, apnsTopic: devAPNsTopic,
		apnsURL: fakeAPNs.URL(), apnsRoots: fakeAPNs.CertPool(),
		fcmCredentialsFile: credentials, fcmURL: fakeFCM.URL(),
	}, stop, nil
}
