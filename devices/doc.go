// Package devices owns users' push devices: registering an Expo token, an
// APNs or FCM token (checked by its channel, a channel.Registrar) or a
// browser's Web Push subscription; the cap of enabled devices a user keeps;
// listing them; and disabling them, by the user or as a provider's answer
// says, as of the send the answer was about, so that a device registered
// again since stays on (DESIGN.md 5: a dead device is disabled, never
// deleted, and registering it again turns it back on).
//
// It imports the channel shape and the channels' token checks, never push:
// the dispatcher and the HTTP API depend on it, not the reverse.
package devices
