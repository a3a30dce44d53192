package spool

import (
	"errors"
	"fmt"
	"os"

	"github.com/spoolcast/spoolcast/internal/filelock"
)

// lockFile takes the spool's lock file for this process; ErrLocked, naming
// the holder, when another process (or another Open here) has it.
func lockFile(path string) (*os.File, error) {
	f, err := filelock.Acquire(path)
	var held *filelock.HeldError
	if errors.As(err, &held) {
		return nil, fmt.Errorf("%w (pid %s holds %s)", ErrLocked, held.PID, path)
	}
	return f, err
}
