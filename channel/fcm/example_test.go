package fcm_test

import (
	"cmp"
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/spoolcast/spoolcast/channel"
	"github.com/spoolcast/spoolcast/channel/fcm"
	"github.com/spoolcast/spoolcast/channel/fcm/fcmtest"
)

// A channel sends with a service account's key file; here a fake FCM's,
// which knows one device that has uninstalled the app.
func Example() {
	fake, err := fcmtest.Start(fcmtest.Config{ProjectID: "my-app"})
	if err != nil {
		log.Fatal(err)
	}
	defer fake.Close()
	dir, _ := os.MkdirTemp("", "fcm-example")
	defer os.RemoveAll(dir)
	keyFile := filepath.Join(dir, "service-account.json")
	if err := fake.WriteCredentials(keyFile); err != nil {
		log.Fatal(err)
	}

	ch, err := fcm.New(fcm.Config{CredentialsFile: keyFile, Endpoint: fake.URL()})
	if err != nil {
		log.Fatal(err)
	}
	defer ch.Close()

	const phone, uninstalled = "dXNlcjEyMzQ1Njc4OTA:APA91bHPRgkF3JUikC4ENAHEeMrd41Z", "dXNlcjk4NzY1NDMyMTA:APA91bGone0000000000000000000000"
	fake.FailToken(uninstalled, fcmtest.Unregistered)
	out := ch.Send(context.Background(), []channel.Message{
		{Token: phone, ID: "ntf_1", Title: "Build failed", Body: "main is red"},
		{Token: uninstalled, ID: "ntf_1", Title: "Build failed", Body: "main is red"},
	})
	for _, o := range out {
		fmt.Println(o.Kind, cmp.Or(o.ID, o.Reason))
	}
	// Output:
	// delivered projects/my-app/messages/0:1
	// token_gone FCM 404 UNREGISTERED: Requested entity was not found.
}
