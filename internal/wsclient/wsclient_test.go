package wsclient

import (
	"net"
	"testing"
	"time"

	"github.com/gobwas/ws"
)

// A frame that arrives in pieces across the wait's end is read whole by
// the next call, and the frames after it stay in step.
func TestAFrameCutByATimeoutIsReadWholeByTheNextCall(t *testing.T) {
	server, client := net.Pipe()
	defer server.Close()
	c := &Conn{conn: client, r: client}
	defer c.Close()
	first := []byte(`{"type":"notification","cursor":"c1","data":{"id":"a","title":"long enough to need an extended length header, more than 125 bytes of payload in all for this test frame"}}`)
	frame1 := ws.MustCompileFrame(ws.NewTextFrame(first))
	frame2 := ws.MustCompileFrame(ws.NewTextFrame([]byte(`{"type":"ready","cursor":"c2"}`)))
	go func() {
		// One byte of the header, then the rest of it and half the payload,
		// each after the reader's wait ended; then the rest and the next frame.
		for _, piece := range [][]byte{frame1[:1], frame1[1:60], frame1[60:], frame2} {
			if _, err := server.Write(piece); err != nil {
				return
			}
			time.Sleep(60 * time.Millisecond)
		}
	}()
	var got []Message
	for deadline := time.Now().Add(5 * time.Second); len(got) < 2 && time.Now().Before(deadline); {
		m, err := c.Next(20 * time.Millisecond)
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				continue
			}
			t.Fatal(err)
		}
		got = append(got, m)
	}
	if len(got) != 2 || got[0].Cursor != "c1" || got[1].Cursor != "c2" || string(got[0].Raw) != string(first) {
		t.Fatalf("read %+v; want both frames whole, in order", got)
	}
}
