package webpush_test

import (
	"errors"
	"fmt"

	"github.com/spoolcast/spoolcast/channel/webpush"
)

func ExampleParseSubscription() {
	// What a service worker posts: JSON.stringify(subscription).
	raw := []byte(`{
		"endpoint": "https://updates.push.services.mozilla.com/wpush/v2/gAAAAABh",
		"expirationTime": null,
		"keys": {
			"p256dh": "BCVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw4",
			"auth": "BTBZMqHH6r4Tts7J_aSIgg=="
		}
	}`)
	sub, err := webpush.ParseSubscription(raw)
	fmt.Println(sub.Endpoint, sub.Auth, err)

	_, err = webpush.ParseSubscription([]byte(`{"endpoint": "http://push.example/x"}`))
	fmt.Println(errors.Is(err, webpush.ErrBadSubscription), err)
	// Output:
	// https://updates.push.services.mozilla.com/wpush/v2/gAAAAABh BTBZMqHH6r4Tts7J_aSIgg <nil>
	// true bad push subscription: endpoint: scheme "http", want https (http only to a loopback host)
}

func ExampleTopicFor() {
	// A digest's pushes replace each other while undelivered.
	msg := webpush.Message{
		Payload: []byte(`{"title":"3 new comments"}`),
		Topic:   webpush.TopicFor("digest:user-42:comments"),
	}
	fmt.Println(msg.Topic)
	// Output: 44Jy8vnxdDF3EccDG71akS4ip_wM7wVC
}
