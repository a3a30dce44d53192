package central

import (
	"testing"
	"time"

	"github.com/spoolcast/spoolcast/internal/clock"
)

func TestAWritePositionReadsBackInPostgresForm(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"0/0", "16/B374D848", "FFFFFFFF/FFFFFFFF", "0/1"} {
		p, err := parseLSN(s)
		if err != nil || p.String() != s {
			t.Errorf("parseLSN(%q) = %v, %v; want it back", s, p, err)
		}
	}
	if p, _ := parseLSN("16/b374d848"); p.String() != "16/B374D848" {
		t.Errorf("lower case = %v", p)
	}
	for _, s := range []string{"", "/", "1/", "/1", "16", "1/2/3", "100000000/0", "0/100000000", "-1/0", "+1/0", "x/1", "0x1/0", " 1/0"} {
		if _, err := parseLSN(s); err == nil {
			t.Errorf("parseLSN(%q) succeeded; want an error", s)
		}
	}
}

func TestAUsersLastWriteIsRememberedForItsWindowOnly(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	p := newWritePositions(7*time.Second, 100, clk)
	p.record("alice", 100)
	p.record("alice", 50) // a write answered out of order does not move it back
	if got := p.lookup("alice"); got != 100 {
		t.Errorf("alice = %v, want 100", got)
	}
	if got := p.lookup("bob"); got != 0 {
		t.Errorf("bob, who wrote nothing = %v", got)
	}
	clk.Advance(5 * time.Second)
	p.record("alice", 200) // a new write starts a new window
	clk.Advance(5 * time.Second)
	if got := p.lookup("alice"); got != 200 {
		t.Errorf("alice 5s after her last write = %v, want 200", got)
	}
	clk.Advance(2 * time.Second)
	if got := p.lookup("alice"); got != 0 {
		t.Errorf("alice past her window = %v, want 0", got)
	}
	if len(p.users) != 0 || p.order.Len() != 0 {
		t.Errorf("%d users kept past their window", len(p.users))
	}
}

func TestWritersPushedOutForRoomHoldEveryReadBackUntilTheirWindowEnds(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	p := newWritePositions(7*time.Second, 2, clk)
	p.record("alice", 10)
	clk.Advance(time.Second)
	p.record("bob", 20)
	p.record("carol", 30) // pushes alice out
	if len(p.users) != 2 {
		t.Fatalf("%d users kept, want at most 2", len(p.users))
	}
	// Alice's write is not forgotten: it is a floor for everyone.
	if got := p.lookup("alice"); got != 10 {
		t.Errorf("alice, pushed out = %v, want 10", got)
	}
	if got := p.lookup("dave"); got != 10 {
		t.Errorf("dave, who wrote nothing = %v, want the floor 10", got)
	}
	if got := p.lookup("carol"); got != 30 {
		t.Errorf("carol = %v, want 30", got)
	}
	clk.Advance(6 * time.Second) // alice's window ends
	if got := p.lookup("dave"); got != 0 {
		t.Errorf("dave after the floor's window = %v, want 0", got)
	}
	if got := p.lookup("bob"); got != 20 {
		t.Errorf("bob = %v, want 20", got)
	}
}
