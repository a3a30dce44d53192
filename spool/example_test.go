package spool_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spoolcast/spoolcast/spool"
)

// The first claim of a key is accepted once it is durable; the same request
// again is a duplicate; another request under the key is a conflict.
func ExampleSpool_Claim() {
	dir, _ := os.MkdirTemp("", "spool-example-")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	s, err := spool.Open(ctx, spool.Config{Path: filepath.Join(dir, "spool.db")})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer s.Close(ctx)

	e := spool.Entry{Producer: "billing", Key: "invoice:7", Hash: []byte("hash-a"), Payload: []byte(`{}`)}
	for _, hash := range []string{"hash-a", "hash-a", "hash-b"} {
		e.Hash = []byte(hash)
		res, _ := s.Claim(ctx, e)
		fmt.Println(res.Outcome)
	}
	st, _ := s.Stats(ctx)
	fmt.Println("pending:", st.Pending)
	// Output:
	// accepted
	// duplicate
	// conflict
	// pending: 1
}
