package apns_test

import (
	"context"
	"fmt"
	"strings"

	"github.com/spoolcast/spoolcast/channel"
	"github.com/spoolcast/spoolcast/channel/apns"
	"github.com/spoolcast/spoolcast/channel/apns/apnstest"
)

func ExampleChannel_Send() {
	key := apnstest.NewKey()
	fake := apnstest.New("ABC123DEFG", "DEF123GHIJ", &key.PublicKey)
	defer fake.Close()
	ch, err := apns.New(apns.Config{
		Key: key, KeyID: "ABC123DEFG", TeamID: "DEF123GHIJ", Topic: "com.example.app",
		Host: fake.URL(), RootCAs: fake.CertPool(), // in production: KeyFile, and neither of these
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer ch.Close()

	installed, uninstalled := strings.Repeat("a1", 32), strings.Repeat("b2", 32)
	fake.Answer(uninstalled, apnstest.Reply{Status: 410, Reason: "Unregistered"})
	outs := ch.Send(context.Background(), []channel.Message{
		{Token: installed, ID: "ntf-1", Title: "New comment", Body: "Ada replied"},
		{Token: uninstalled, ID: "ntf-1", Title: "New comment", Body: "Ada replied"},
	})
	for _, o := range outs {
		fmt.Println(o.Kind, o.Reason)
	}
	// Output:
	// delivered APNs 200 OK
	// token_gone APNs 410 Unregistered
}
