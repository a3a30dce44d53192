// Package filelock gives a process sole use of a file or directory: an
// exclusive, non-blocking flock on a lock file that names its holder. The
// kernel drops the lock when the process dies, so a crash never leaves a
// stale lock.
package filelock

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// ErrHeld: another process holds the lock.
var ErrHeld = errors.New("held by another process")

// HeldError says which process holds the lock.
type HeldError struct {
	Path string
	PID  string // "" when the holder did not say
}

func (e *HeldError) Error() string {
	if e.PID == "" {
		return fmt.Sprintf("%s is %v", e.Path, ErrHeld)
	}
	return fmt.Sprintf("%s is %v (pid %s)", e.Path, ErrHeld, e.PID)
}

// Unwrap lets errors.Is find ErrHeld.
func (e *HeldError) Unwrap() error { return ErrHeld }

// Acquire takes the lock file at path, creating it, and writes this process's
// id into it. Closing the returned file releases the lock. The lock file must
// be a file of its own: SQLite's locks on a database file are POSIX locks,
// which closing a second descriptor of that file would release.
func Acquire(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock file: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, &HeldError{Path: path, PID: strings.TrimSpace(string(holder))}
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}
