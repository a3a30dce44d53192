// Package disktest gives tests a small real filesystem to fill up: a tmpfs of
// a chosen size, so that writes fail with ENOSPC as on a full disk.
package disktest

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// Small mounts a tmpfs of size bytes on a new directory and returns its path;
// it is unmounted when the test ends. Mounting needs CAP_SYS_ADMIN (root in
// CI); without it the test is skipped, unless SPOOLCAST_REQUIRE_TMPFS=1.
func Small(t testing.TB, size int64) string {
	t.Helper()
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%d,mode=0777", size)); err != nil {
		if os.Getenv("SPOOLCAST_REQUIRE_TMPFS") == "1" {
			t.Fatalf("mount a tmpfs (SPOOLCAST_REQUIRE_TMPFS=1): %v", err)
		}
		t.Skipf("cannot mount a tmpfs to fill up (needs root): %v", err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", dir, err)
		}
	})
	return dir
}

// Fill writes a file of zeros into dir until the filesystem has at most
// leave bytes free, and returns its path: remove it to free the space.
func Fill(t testing.TB, dir string, leave int64) string {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	free := int64(st.Bavail) * st.Bsize
	path := filepath.Join(dir, "filler")
	if free <= leave {
		return path
	}
	if err := os.WriteFile(path, make([]byte, free-leave), 0o644); err != nil {
		t.Fatalf("fill %s: %v", dir, err)
	}
	return path
}
