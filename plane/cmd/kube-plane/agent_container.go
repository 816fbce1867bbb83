package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/cri-client/pkg/logs"
)

// Containers as processes: each run of a container is one `kube-plane pod-exec` process in its
// own process group, whose stdout and stderr the agent writes to a CRI-format log file.

const containerIDPrefix = "servebook-agent://"

// container is the agent's state of one container of a Pod; only its Pod's worker touches it.
type container struct {
	name      string
	restarts  int32
	cur, prev *containerRun
	waiting   *v1.ContainerStateWaiting // why it is not running now; nil when it runs or never tried
	backoff   time.Duration             // the kubelet's crash-loop back-off; 0 before the first restart
	backoffAt time.Time                 // when backoff last grew
	gpus      []int
}

func (c *container) running() bool { return c.cur != nil && !c.cur.exited() }

// containerRun is one run: one process group and one log file.
type containerRun struct {
	id        string    // containerIDPrefix + hex
	specPath  string    // pod-exec's spec, reused by exec probes and kubectl exec
	spec      *execSpec // what specPath holds
	pgid      int
	startedAt time.Time
	logPath   string
	termLog   string
	probes    *probeState
	killing   bool // a kill is under way (set by the worker)
	done      chan struct{}

	// Written before done is closed.
	finishedAt time.Time
	exitCode   int32
	message    string
}

func (r *containerRun) exited() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

func (r *containerRun) view() *runView {
	v := &runView{ID: r.id, StartedAt: r.startedAt}
	if r.exited() {
		v.Exited, v.ExitCode, v.FinishedAt, v.Message = true, r.exitCode, r.finishedAt, r.message
	}
	return v
}

// newContainerRun prepares a run's files in dir: its spec, log and termination log.
func newContainerRun(dir string) (*containerRun, error) {
	id, err := randomID()
	if err != nil {
		return nil, err
	}
	run := &containerRun{id: containerIDPrefix + id, done: make(chan struct{}),
		specPath: filepath.Join(dir, id+".json"), logPath: filepath.Join(dir, id+".log"), termLog: filepath.Join(dir, id+".termination-log")}
	return run, os.WriteFile(run.termLog, nil, 0o666)
}

// launch starts spec through pod-exec; exited is called (from another goroutine) once the
// process group's leader has exited.
func (a *agent) launch(run *containerRun, spec *execSpec, podKey, name string, termPolicy v1.TerminationMessagePolicy, exited func()) error {
	data, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	if err := os.WriteFile(run.specPath, data, 0o600); err != nil {
		return err
	}
	run.spec = spec
	cmd := a.podExecCommand(context.Background(), run, nil)
	logf, err := startLogging(cmd, run.logPath)
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		logf.closeWriters()
		return err
	}
	logf.closeWriters() // the child has its copies
	run.pgid, run.startedAt = cmd.Process.Pid, time.Now()
	a.procs.add(run.pgid, podKey, name)
	go a.waitRun(cmd, run, logf, termPolicy, exited)
	return nil
}

// podExecCommand runs pod-exec with a run's spec in fresh mount (and UTS) namespaces, in a
// new process group; argv, when given, replaces the spec's (exec probes, hooks, kubectl exec).
// Cancelling ctx kills the whole group.
func (a *agent) podExecCommand(ctx context.Context, run *containerRun, argv []string) *exec.Cmd {
	args := []string{"pod-exec", "--spec", run.specPath}
	if len(argv) > 0 {
		args = append(append(args, "--"), argv...)
	}
	cmd := exec.CommandContext(ctx, a.exe, args...)
	flags := uintptr(syscall.CLONE_NEWNS)
	if run.spec.Hostname != "" {
		flags |= syscall.CLONE_NEWUTS
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Cloneflags: flags}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = time.Second
	return cmd
}

// waitRun records the exit: the rest of the process group goes with its leader, as a
// container's processes go with its init process.
func (a *agent) waitRun(cmd *exec.Cmd, run *containerRun, logf *logSink, termPolicy v1.TerminationMessagePolicy, exited func()) {
	err := cmd.Wait()
	run.finishedAt = time.Now()
	_ = syscall.Kill(-run.pgid, syscall.SIGKILL)
	a.procs.remove(run.pgid)
	run.exitCode = exitCode(cmd.ProcessState, err)
	logf.wait(2 * time.Second)
	run.message = terminationMessage(run, termPolicy)
	close(run.done)
	exited()
}

// exitCode is what a container runtime reports: the status, or 128+signal.
func exitCode(ps *os.ProcessState, err error) int32 {
	if ps == nil {
		return 128
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int32(ws.Signal())
	}
	if ps.ExitCode() < 0 && err != nil {
		return 128
	}
	return int32(ps.ExitCode())
}

// terminationMessage is the kubelet's: the file the container wrote (at most 4096 bytes), or
// with FallbackToLogsOnError the end of its log when it failed without writing one.
func terminationMessage(run *containerRun, policy v1.TerminationMessagePolicy) string {
	data, _ := os.ReadFile(run.termLog)
	if len(data) > 4096 {
		data = data[:4096]
	}
	if len(data) > 0 || policy != v1.TerminationMessageFallbackToLogsOnError || run.exitCode == 0 {
		return string(data)
	}
	var buf bytes.Buffer
	tail := int64(80)
	_ = logs.ReadLogs(context.Background(), run.logPath, "", &logs.LogOptions{TailLines: &tail}, nil, &buf, &buf)
	msg := buf.Bytes()
	return string(msg[max(0, len(msg)-2048):]) // the last 2048 bytes of the last 80 lines
}

// criLogOptions converts PodLogOptions as the kubelet's runtime manager does.
func criLogOptions(o *v1.PodLogOptions, now time.Time) *logs.LogOptions {
	opts := &logs.LogOptions{TailLines: o.TailLines, LimitBytes: o.LimitBytes, Follow: o.Follow, Timestamp: o.Timestamps}
	if o.SinceSeconds != nil {
		opts.Since = now.Add(-time.Duration(*o.SinceSeconds) * time.Second)
	}
	if o.SinceTime != nil && o.SinceTime.After(opts.Since) {
		opts.Since = o.SinceTime.Time
	}
	return opts
}

// kill stops a run: SIGTERM to its process group, SIGKILL after grace or once hurry is
// closed. It returns once the run has exited.
func (r *containerRun) kill(grace time.Duration, hurry <-chan struct{}) {
	if r.exited() {
		return
	}
	if grace > 0 {
		_ = syscall.Kill(-r.pgid, syscall.SIGTERM)
		timer := time.NewTimer(grace)
		defer timer.Stop()
		select {
		case <-r.done:
			return
		case <-timer.C:
		case <-hurry:
		}
	}
	if !r.exited() {
		_ = syscall.Kill(-r.pgid, syscall.SIGKILL)
	}
	<-r.done
}

// execInRun runs argv in a run's namespaces, with its mounts and environment (exec probes and
// hooks); the output is capped like the kubelet caps it.
func (a *agent) execInRun(run *containerRun) func(ctx context.Context, argv []string) ([]byte, error) {
	return func(ctx context.Context, argv []string) ([]byte, error) {
		if len(argv) == 0 {
			return nil, errors.New("empty command")
		}
		cmd := a.podExecCommand(ctx, run, localArgv(argv, a.cfg.Python, a.exe))
		out := &cappedBuffer{max: 10 * 1024}
		cmd.Stdout, cmd.Stderr = out, out
		err := cmd.Run()
		return out.buf.Bytes(), err
	}
}

// cappedBuffer keeps the first max bytes written to it.
type cappedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
	max int
}

func (b *cappedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := b.max - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func randomID() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

// logSink writes a process's stdout and stderr to a log file in the CRI format the kubelet
// reads ("<RFC3339Nano> <stream> <F|P> <line>"), one line per line, long lines split.
type logSink struct {
	mu      sync.Mutex
	f       *os.File
	writers []*os.File // the child's ends
	wg      sync.WaitGroup
}

func startLogging(cmd *exec.Cmd, path string) (*logSink, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return nil, err
	}
	s := &logSink{f: f}
	for _, stream := range []string{"stdout", "stderr"} {
		r, w, err := os.Pipe()
		if err != nil {
			s.closeWriters()
			f.Close()
			return nil, err
		}
		s.writers = append(s.writers, w)
		s.wg.Add(1)
		go s.copy(r, stream)
	}
	cmd.Stdout, cmd.Stderr = s.writers[0], s.writers[1]
	go func() { s.wg.Wait(); f.Close() }()
	return s, nil
}

func (s *logSink) closeWriters() {
	for _, w := range s.writers {
		w.Close()
	}
}

// wait gives the readers a moment to drain; a process that escaped its group may hold the
// pipe open for longer, and its output still goes to the file.
func (s *logSink) wait(d time.Duration) {
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
	}
}

func (s *logSink) copy(r *os.File, stream string) {
	defer s.wg.Done()
	defer r.Close()
	br := bufio.NewReaderSize(r, 16*1024)
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 {
			tag := "F"
			if errors.Is(err, bufio.ErrBufferFull) {
				tag = "P"
			}
			s.write(stream, tag, bytes.TrimSuffix(line, []byte("\n")))
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			return
		}
	}
}

func (s *logSink) write(stream, tag string, content []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ts := time.Now().UTC().Format(logs.RFC3339NanoFixed)
	fmt.Fprintf(s.f, "%s %s %s %s\n", ts, stream, tag, content)
}

// processTable is stateDir/processes.json: every live process group, so that `down` can end
// what a killed agent left behind.
type processTable struct {
	mu      sync.Mutex
	path    string
	entries map[int]processEntry
}

type processEntry struct {
	PGID      int    `json:"pgid"`
	StartTime string `json:"startTime"` // field 22 of /proc/PID/stat: tells a reused PID apart
	Pod       string `json:"pod"`
	Container string `json:"container"`
}

func newProcessTable(path string) *processTable {
	t := &processTable{path: path, entries: map[int]processEntry{}}
	t.save()
	return t
}

func (t *processTable) add(pgid int, pod, container string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.entries[pgid] = processEntry{PGID: pgid, StartTime: procStartTime(pgid), Pod: pod, Container: container}
	t.saveLocked()
}

func (t *processTable) remove(pgid int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.entries, pgid)
	t.saveLocked()
}

// signalAll sends sig to every process group in the table.
func (t *processTable) signalAll(sig syscall.Signal) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for pgid := range t.entries {
		_ = syscall.Kill(-pgid, sig)
	}
}

func (t *processTable) save() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.saveLocked()
}

// saveLocked writes atomically (rename), so that `down` never reads half a file.
func (t *processTable) saveLocked() {
	list := make([]processEntry, 0, len(t.entries))
	for _, e := range t.entries {
		list = append(list, e)
	}
	data, _ := json.Marshal(list)
	tmp := t.path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err == nil {
		_ = os.Rename(tmp, t.path)
	}
}

// procStartTime is field 22 of /proc/PID/stat (the process's start time in clock ticks).
func procStartTime(pid int) string {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	// The command name (field 2) is in parentheses and may contain spaces: count from after it.
	s := string(data)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 20 {
		return ""
	}
	return fields[19]
}
