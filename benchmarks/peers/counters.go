package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// counters are what a target's processes and its disk had done at one
// moment.
type counters struct {
	// writeBytes sums /proc/<pid>/io write_bytes (bytes the process caused
	// to be written to storage, charged when it dirties the page cache) over
	// the storage processes and their live descendants. The kernel charges
	// a whole folio each time a clean one is dirtied: with large folios
	// (ext4 since Linux 6.16) a 100-byte overwrite counts up to 2 MiB, so
	// stores that rewrite a log's last page in place show far more than
	// reaches the disk (see README.md).
	writeBytes int64
	// deviceBytes is the block device's sectors written (/proc/diskstats)
	// times 512: every process's writes, this program's others included.
	deviceBytes int64
	// cpu sums user and system time over every process of the target.
	cpu time.Duration
}

func (c counters) sub(o counters) counters {
	return counters{writeBytes: c.writeBytes - o.writeBytes, deviceBytes: c.deviceBytes - o.deviceBytes, cpu: c.cpu - o.cpu}
}

func sampleCounters(in *instance, dir string) counters {
	procs := readProcs()
	var c counters
	for _, pid := range procs.tree(pids(in.storage)) {
		c.writeBytes += writeBytes(pid)
	}
	for _, pid := range procs.tree(pids(in.all)) {
		c.cpu += procs[pid].cpu
	}
	c.deviceBytes = deviceSectorsWritten(dir) * 512
	return c
}

type procInfo struct {
	ppid int
	cpu  time.Duration
}

type procTable map[int]procInfo

// readProcs reads every process's parent and CPU time from /proc/*/stat.
func readProcs() procTable {
	t := procTable{}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, path := range stats {
		b, err := os.ReadFile(path)
		if err != nil {
			continue // exited meanwhile
		}
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(path)))
		// pid (comm) state ppid … utime stime …: comm may hold spaces.
		_, rest, ok := bytes.Cut(b, []byte(") "))
		fields := strings.Fields(string(rest))
		if !ok || len(fields) < 13 {
			continue
		}
		ppid, _ := strconv.Atoi(fields[1])
		utime, _ := strconv.ParseInt(fields[11], 10, 64)
		stime, _ := strconv.ParseInt(fields[12], 10, 64)
		// /proc counts in USER_HZ, 100 a second on Linux.
		t[pid] = procInfo{ppid: ppid, cpu: time.Duration(utime+stime) * 10 * time.Millisecond}
	}
	return t
}

// tree returns roots and all their live descendants.
func (t procTable) tree(roots []int) []int {
	children := map[int][]int{}
	for pid, p := range t {
		children[p.ppid] = append(children[p.ppid], pid)
	}
	var out []int
	queue := append([]int(nil), roots...)
	for len(queue) > 0 {
		pid := queue[0]
		queue = queue[1:]
		if _, alive := t[pid]; !alive {
			continue
		}
		out = append(out, pid)
		queue = append(queue, children[pid]...)
	}
	return out
}

func writeBytes(pid int) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "write_bytes: "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

// deviceSectorsWritten reads sectors written of the block device (or
// partition) holding dir; 0 if it has none (a tmpfs).
func deviceSectorsWritten(dir string) int64 {
	var st syscall.Stat_t
	if err := syscall.Stat(dir, &st); err != nil {
		return 0
	}
	major := (st.Dev>>8)&0xfff | (st.Dev>>32)&^0xfff
	minor := st.Dev&0xff | (st.Dev>>12)&^0xff
	b, err := os.ReadFile("/proc/diskstats")
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) > 9 && f[0] == strconv.FormatUint(major, 10) && f[1] == strconv.FormatUint(minor, 10) {
			n, _ := strconv.ParseInt(f[9], 10, 64)
			return n
		}
	}
	return 0
}

// idleDeviceRate is the bytes a second written to dir's device over d while
// no target runs.
func idleDeviceRate(dir string, d time.Duration) float64 {
	before := deviceSectorsWritten(dir)
	time.Sleep(d)
	return float64((deviceSectorsWritten(dir)-before)*512) / d.Seconds()
}

func pids(cmds []*exec.Cmd) []int {
	out := make([]int, len(cmds))
	for i, cmd := range cmds {
		out[i] = cmd.Process.Pid
	}
	return out
}
