package fcm

// Registration tokens' bounds: FCM documents no format, and tokens seen
// are about 150 to 200 characters; these only refuse what cannot be one.
const (
	minTokenLen = 32
	maxTokenLen = 4096
)

// ValidToken reports whether s could be an FCM registration token: 32 to
// 4096 characters of [A-Za-z0-9_:-]. FCM's tokens are opaque and their
// shape is not promised, so this refuses only what cannot be one (an APNs
// hex token passes; an Expo token, with its brackets, or a blank does
// not); FCM alone says whether a token is registered.
func ValidToken(s string) bool {
	if len(s) < minTokenLen || len(s) > maxTokenLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		switch b := s[i]; {
		case 'a' <= b && b <= 'z', 'A' <= b && b <= 'Z', '0' <= b && b <= '9', b == '_', b == ':', b == '-':
		default:
			return false
		}
	}
	return true
}

// Platforms: FCM reaches Android apps, and iOS apps through APNs.
func (*Channel) Platforms() []string { return []string{"android", "ios"} }

// ValidToken is the package's ValidToken, for the dispatcher and device
// registration.
func (*Channel) ValidToken(s string) bool { return ValidToken(s) }
