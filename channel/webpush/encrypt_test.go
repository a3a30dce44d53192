package webpush

import (
	"bytes"
	"crypto/ecdh"
	"crypto/rand"
	"encoding/base64"
	"testing"
)

func unb64(t *testing.T, s string) []byte {
	t.Helper()
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestEncryptGivesRFC8291sExample: with the keys and salt of RFC 8291's
// Appendix A, encrypt writes the body the RFC does, byte for byte.
func TestEncryptGivesRFC8291sExample(t *testing.T) {
	t.Parallel()
	as, err := ecdh.P256().NewPrivateKey(unb64(t, "yfWPiYE-n46HLnH0KqZOF1fJJU3MYrct3AELtAQ-oRw"))
	if err != nil {
		t.Fatal(err)
	}
	ua, err := ecdh.P256().NewPublicKey(unb64(t, "BCVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw4"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := encrypt([]byte("When I grow up, I want to be a watermelon"), ua,
		unb64(t, "BTBZMqHH6r4Tts7J_aSIgg"), as, unb64(t, "DGv6ra1nlYgDCS1FRnbzlw"))
	if err != nil {
		t.Fatal(err)
	}
	want := unb64(t, "DGv6ra1nlYgDCS1FRnbzlwAAEABBBP4z9KsN6nGRTbVYI_c7VJSPQTBtkgcy27mlmlMoZIIgDll6e3vCYLocInmYWAmS6TlzAC8wEqKK6PBru3jl7A_yl95bQpu6cVPTpK4Mqgkf1CXztLVBSt2Ks3oZwbuwXPXLWyouBWLVWGNWQexSgSxsj_Qulcy4a-fN")
	if !bytes.Equal(got, want) {
		t.Errorf("encrypt:\n got %x\nwant %x", got, want)
	}
}

func TestTheLargestPayloadMakesA4096ByteBody(t *testing.T) {
	t.Parallel()
	as, _ := ecdh.P256().GenerateKey(rand.Reader)
	ua, _ := ecdh.P256().GenerateKey(rand.Reader)
	body, err := encrypt(make([]byte, MaxPayload), ua.PublicKey(), make([]byte, 16), as, make([]byte, 16))
	if err != nil {
		t.Fatal(err)
	}
	if len(body) != 4096 || MaxPayload != 3993 {
		t.Errorf("a %d-byte payload makes a %d-byte body, want 4096", MaxPayload, len(body))
	}
}
