package preferences

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkPreferenceCacheStoreAtTheBound stores answers into a full cache
// of 1,000 and of 100,000 users, nothing expired: the time per store is the
// same for both.
func BenchmarkPreferenceCacheStoreAtTheBound(b *testing.B) {
	now := time.Unix(0, 0)
	for _, size := range []int{1_000, prefsCacheSize} {
		b.Run(fmt.Sprint(size), func(b *testing.B) {
			c := fill(size, size, now)
			users := make([]string, 1024)
			for i := range users {
				users[i] = fmt.Sprint("new", i)
			}
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				c.put(users[i%len(users)], nil, now)
			}
		})
	}
}
