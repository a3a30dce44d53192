package fcm_test

import (
	"strings"
	"testing"

	"github.com/spoolcast/spoolcast/channel/fcm"
)

func TestValidTokenRefusesOnlyWhatCannotBeAnFCMToken(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		token string
		want  bool
	}{
		{"an FCM token", "dXNlcjEyMzQ1Njc4OTA:APA91bHPRgkF3JUikC4ENAHEeMrd41Zxv3hVZjC9KtT8OvPVGJ-hQMRKRrZuJAEcl7B338qju59zJMjw2DELjzEvxwYv7hH5Ynpc1ODQ0aT4U4OFEeco8ohsN5PjL1iC2dNtk2BAokeMCg2ZXKqpc8FXKmhX94kIxQ", true},
		{"an APNs token's hex, which only FCM can refuse", strings.Repeat("ab12", 16), true},
		{"32 characters", strings.Repeat("a", 32), true},
		{"4096 characters", strings.Repeat("a", 4096), true},
		{"31 characters", strings.Repeat("a", 31), false},
		{"4097 characters", strings.Repeat("a", 4097), false},
		{"blank", "", false},
		{"an Expo token", "ExponentPushToken[xxxxxxxxxxxxxxxxxxxxxxxxxxxxxx]", false},
		{"a space inside", strings.Repeat("a", 20) + " " + strings.Repeat("a", 20), false},
		{"a dot inside", strings.Repeat("a", 20) + "." + strings.Repeat("a", 20), false},
		{"a letter beyond ASCII", strings.Repeat("a", 40) + "é", false},
	} {
		if got := fcm.ValidToken(tc.token); got != tc.want {
			t.Errorf("%s: ValidToken = %v, want %v", tc.name, got, tc.want)
		}
	}
}
