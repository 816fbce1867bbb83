package main

// `kube-plane down DIR` stops exactly what `up` recorded in DIR/plane.json (each process by
// its PID and start time, so a recycled PID is never signalled), then any Pod process the
// node agent left (DIR/agent/processes.json), then the plane's own links and network
// namespaces (named after its bridge), then the bridge.

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

func runDown(args []string) int {
	if len(args) != 1 || strings.HasPrefix(args[0], "-") {
		fmt.Fprintln(os.Stderr, "usage: kube-plane down DIR")
		return 2
	}
	dir, err := filepath.Abs(args[0])
	if err != nil {
		fmt.Fprintln(os.Stderr, "kube-plane down:", err)
		return 2
	}
	r, err := readRecord(dir)
	if errors.Is(err, fs.ErrNotExist) {
		fmt.Printf("no plane recorded in %s: nothing to stop\n", dir)
		return 0
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kube-plane down:", err)
		return 2
	}
	if !tearDown(r, os.Stdout) {
		return 1
	}
	return 0
}

// tearDown stops the plane's processes newest first (the node agent before the API server,
// so it can still finish its Pods), and reports what it did on w. It returns false when
// something could not be stopped.
func tearDown(r *record, w io.Writer) bool {
	ok := true
	for i := len(r.Processes) - 1; i >= 0; i-- {
		p := r.Processes[i]
		grace := 10 * time.Second
		if p.Part == "node-agent" {
			grace = 30 * time.Second
		}
		if stopped, err := stop(p.PID, p.StartTime, grace, true); err != nil {
			fmt.Fprintf(w, "could not stop %s (pid %d): %v\n", p.Part, p.PID, err)
			ok = false
		} else if stopped {
			fmt.Fprintf(w, "stopped %s (pid %d)\n", p.Part, p.PID)
		}
	}
	ok = killLeftPods(r.Layout.path("agent", "processes.json"), w) && ok
	ok = removeLinks(r.Layout.Bridge, w) && ok
	if ok {
		if err := os.Remove(recordPath(r.Layout.Dir)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			fmt.Fprintln(w, "could not remove the record:", err)
			ok = false
		}
		_ = os.Remove(r.Layout.path("kubeconfig"))
	}
	return ok
}

// stop sends SIGTERM to the process (or its group), waits up to grace, then SIGKILLs it.
// It returns whether it was running.
func stop(pid int, since string, grace time.Duration, group bool) (bool, error) {
	same := func() bool {
		now, err := startTime(pid)
		return err == nil && now == since
	}
	if !same() {
		return false, nil
	}
	target := pid
	if group {
		target = -pid
	}
	_ = syscall.Kill(target, syscall.SIGTERM)
	deadline := time.Now().Add(grace)
	for time.Now().Before(deadline) {
		if !same() || zombie(pid) {
			return true, nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	_ = syscall.Kill(target, syscall.SIGKILL)
	for i := 0; i < 50; i++ {
		if !same() || zombie(pid) {
			return true, nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return true, errors.New("still running after SIGKILL")
}

func zombie(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	s := string(data)
	end := strings.LastIndexByte(s, ')')
	return end > 0 && len(s) > end+2 && s[end+2] == 'Z'
}

type podProcess struct {
	PGID      int    `json:"pgid"`
	StartTime string `json:"startTime"`
	Pod       string `json:"pod"`
	Container string `json:"container"`
}

// killLeftPods stops the Pod processes a node agent that died could not stop itself.
func killLeftPods(path string, w io.Writer) bool {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return true
	}
	var left []podProcess
	if err == nil {
		err = json.Unmarshal(data, &left)
	}
	if err != nil {
		fmt.Fprintf(w, "could not read %s: %v\n", path, err)
		return false
	}
	ok := true
	for _, p := range left {
		stopped, err := stop(p.PGID, p.StartTime, 5*time.Second, true)
		if err != nil {
			fmt.Fprintf(w, "could not stop %s/%s (pid %d): %v\n", p.Pod, p.Container, p.PGID, err)
			ok = false
		} else if stopped {
			fmt.Fprintf(w, "stopped Pod process %s/%s (pid %d) the node agent had left\n", p.Pod, p.Container, p.PGID)
		}
	}
	return ok
}

// removeLinks deletes the plane's network namespaces, links and bridge: every name the plane
// made starts with its bridge's name.
func removeLinks(bridge string, w io.Writer) bool {
	if bridge == "" {
		return true
	}
	ok := true
	if out, err := exec.Command("ip", "netns", "list").Output(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			fields := strings.Fields(line)
			if len(fields) > 0 && strings.HasPrefix(fields[0], bridge+"-") {
				name := fields[0]
				if err := exec.Command("ip", "netns", "del", name).Run(); err != nil {
					fmt.Fprintf(w, "could not delete network namespace %s: %v\n", name, err)
					ok = false
				}
			}
		}
	}
	links, _ := filepath.Glob("/sys/class/net/" + bridge + "*")
	for _, l := range links {
		name := filepath.Base(l)
		if name == bridge || strings.HasPrefix(name, bridge+"s") || strings.HasPrefix(name, bridge+"-") || strings.HasPrefix(name, bridge+"v") {
			if out, err := exec.Command("ip", "link", "del", name).CombinedOutput(); err != nil && !strings.Contains(string(out), "Cannot find") {
				fmt.Fprintf(w, "could not delete link %s: %s\n", name, strings.TrimSpace(string(out)))
				ok = false
			}
		}
	}
	return ok
}
