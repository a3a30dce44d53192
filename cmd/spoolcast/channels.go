package main

import (
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"

	"github.com/spoolcast/spoolcast/channel"
	"github.com/spoolcast/spoolcast/channel/apns"
	"github.com/spoolcast/spoolcast/channel/apns/tokenstore"
	"github.com/spoolcast/spoolcast/channel/fcm"
)

// channelFlags set up the providers behind the channel shape: APNs and
// FCM, beside Expo and Web Push.
type channelFlags struct {
	apnsKeyFile, apnsKeyID, apnsTeamID, apnsTopic string
	apnsSandbox                                   bool
	apnsURL, apnsCAFile                           string
	apnsConcurrency                               int
	fcmCredentialsFile, fcmProject, fcmURL        string
	fcmConcurrency                                int
	// apnsRoots, set by spoolcast dev for its fake APNs, replace the
	// system's roots as --apns-ca-file does.
	apnsRoots *x509.CertPool
}

func (c *channelFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.apnsKeyFile, "apns-key-file", "", "APNs token-auth key (the .p8 file from the Apple developer account, Keys); set, central sends to APNs directly for devices registered with provider apns. Needs --apns-key-id, --apns-team-id and --apns-topic")
	fs.StringVar(&c.apnsKeyID, "apns-key-id", "", "the APNs key's id (10 characters, shown beside the key in the developer account)")
	fs.StringVar(&c.apnsTeamID, "apns-team-id", "", "the Apple developer team id (10 characters) the key belongs to")
	fs.StringVar(&c.apnsTopic, "apns-topic", "", "the iOS app's bundle id (apns-topic)")
	fs.BoolVar(&c.apnsSandbox, "apns-sandbox", false, "send to APNs' sandbox (api.sandbox.push.apple.com), where development builds' tokens live. Tokens of the other environment are answered BadDeviceToken, and disabled: set it to what the app's builds use")
	fs.StringVar(&c.apnsURL, "apns-url", "", "base URL replacing APNs' host (a proxy, tests)")
	fs.StringVar(&c.apnsCAFile, "apns-ca-file", "", "PEM file of the only CA certificates trusted for --apns-url's TLS (a proxy, tests); unset, the system's")
	fs.IntVar(&c.apnsConcurrency, "apns-concurrency", 100, "most APNs requests in flight from this replica, as streams of one HTTP/2 connection")
	fs.StringVar(&c.fcmCredentialsFile, "fcm-credentials-file", "", "a Google service account's JSON key with the Firebase Cloud Messaging API Admin role; set, central sends to FCM (HTTP v1) directly for devices registered with provider fcm")
	fs.StringVar(&c.fcmProject, "fcm-project", "", "the Firebase project id; default the key file's project_id")
	fs.StringVar(&c.fcmURL, "fcm-url", "", "base URL replacing fcm.googleapis.com (a proxy, tests); the token endpoint is the key file's token_uri")
	fs.IntVar(&c.fcmConcurrency, "fcm-concurrency", 100, "most FCM requests in flight from this replica")
}

func (c *channelFlags) validate() error {
	apnsSet := c.apnsKeyFile != "" || c.apnsKeyID != "" || c.apnsTeamID != "" || c.apnsTopic != ""
	switch {
	case apnsSet && (c.apnsKeyFile == "" || c.apnsKeyID == "" || c.apnsTeamID == "" || c.apnsTopic == ""):
		return errors.New("APNs needs all of --apns-key-file, --apns-key-id, --apns-team-id and --apns-topic")
	case c.apnsCAFile != "" && c.apnsRoots != nil:
		return errors.New("--apns-ca-file is set by spoolcast dev for its fake APNs")
	case !apnsSet && (c.apnsURL != "" || c.apnsCAFile != "" || c.apnsSandbox):
		return errors.New("--apns-url, --apns-ca-file and --apns-sandbox need --apns-key-file")
	case c.fcmCredentialsFile == "" && (c.fcmProject != "" || c.fcmURL != ""):
		return errors.New("--fcm-project and --fcm-url need --fcm-credentials-file")
	case c.apnsConcurrency < 0 || c.fcmConcurrency < 0:
		// 0 is the channels' default: spoolcast dev leaves them unset.
		return errors.New("--apns-concurrency and --fcm-concurrency must not be negative")
	}
	return nil
}

// channels builds the providers set up; the caller closes them. APNs
// provider tokens are shared through db by every replica.
func (c *channelFlags) channels(db tokenstore.DB, logger *slog.Logger) ([]channel.Channel, error) {
	var out []channel.Channel
	if c.apnsKeyFile != "" {
		cfg := apns.Config{KeyFile: c.apnsKeyFile, KeyID: c.apnsKeyID, TeamID: c.apnsTeamID, Topic: c.apnsTopic,
			Sandbox: c.apnsSandbox, Host: c.apnsURL, Concurrency: c.apnsConcurrency, RootCAs: c.apnsRoots,
			Tokens: tokenstore.New(db), Logger: logger}
		if c.apnsCAFile != "" {
			pem, err := os.ReadFile(c.apnsCAFile)
			if err != nil {
				return nil, fmt.Errorf("--apns-ca-file: %w", err)
			}
			cfg.RootCAs = x509.NewCertPool()
			if !cfg.RootCAs.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("--apns-ca-file %s: no PEM certificate in it", c.apnsCAFile)
			}
		}
		ch, err := apns.New(cfg)
		if err != nil {
			return nil, err
		}
		out = append(out, ch)
	}
	if c.fcmCredentialsFile != "" {
		ch, err := fcm.New(fcm.Config{CredentialsFile: c.fcmCredentialsFile, ProjectID: c.fcmProject, Endpoint: c.fcmURL, Concurrency: c.fcmConcurrency})
		if err != nil {
			closeChannels(out)
			return nil, err
		}
		out = append(out, ch)
	}
	return out, nil
}

// closeChannels releases the channels' connections.
func closeChannels(chs []channel.Channel) {
	for _, ch := range chs {
		if c, ok := ch.(interface{ Close() error }); ok {
			_ = c.Close()
		}
	}
}
