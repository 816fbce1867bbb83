package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	internalapi "k8s.io/cri-api/pkg/apis"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/logs"
	"k8s.io/cri-streaming/pkg/streaming/portforward"
	"k8s.io/cri-streaming/pkg/streaming/remotecommand"
	utilexec "k8s.io/utils/exec"
)

// The kubelet API on bridgeIP:kubeletPort, for the API server's pods/log, pods/portforward
// and pods/exec. TLS with a client certificate signed by the cluster CA is required. One
// server serves every node of the agent: Pods are found by namespace and name.

const (
	streamIdleTimeout     = 4 * time.Hour // the kubelet's streamingConnectionIdleTimeout
	streamCreationTimeout = 30 * time.Second
)

func (a *agent) startKubeletServer() (*http.Server, error) {
	ca, err := os.ReadFile(a.cfg.ClientCA)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("%s: no certificate", a.cfg.ClientCA)
	}
	cert, err := tls.LoadX509KeyPair(a.cfg.TLSCert, a.cfg.TLSKey)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })
	mux.HandleFunc("GET /pods", a.servePods)
	mux.HandleFunc("GET /containerLogs/{ns}/{pod}/{container}", a.serveLogs)
	mux.HandleFunc("/portForward/{ns}/{pod}", a.servePortForward)
	mux.HandleFunc("/portForward/{ns}/{pod}/{uid}", a.servePortForward)
	mux.HandleFunc("/exec/{ns}/{pod}/{container}", a.serveExec)
	mux.HandleFunc("/exec/{ns}/{pod}/{uid}/{container}", a.serveExec)
	for _, p := range []string{"/attach/", "/run/"} {
		mux.HandleFunc(p, func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "servebook's node agent does not implement "+r.URL.Path[:len(p)-1]+
				" (it serves containerLogs, portForward and exec)", http.StatusNotImplemented)
		})
	}
	srv := &http.Server{
		Handler: mux,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool,
			ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12},
		// HTTP/1.1 only: port-forward and exec upgrade the connection (SPDY).
		TLSNextProto:      map[string]func(*http.Server, *tls.Conn, http.Handler){},
		ReadHeaderTimeout: 30 * time.Second,
		ErrorLog:          log.New(io.Discard, "", 0),
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(a.cfg.BridgeIP, strconv.Itoa(a.cfg.KubeletPort)))
	if err != nil {
		return nil, err
	}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	return srv, nil
}

func (a *agent) servePods(w http.ResponseWriter, _ *http.Request) {
	list := v1.PodList{TypeMeta: metav1.TypeMeta{Kind: "PodList", APIVersion: "v1"}}
	for _, wk := range a.workerList() {
		pod, _ := wk.snapshot()
		list.Items = append(list.Items, *pod)
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(list)
}

// serveLogs follows the kubelet's getContainerLogs and GetKubeletContainerLogs, down to
// their error texts.
func (a *agent) serveLogs(w http.ResponseWriter, r *http.Request) {
	ns, name, cname := r.PathValue("ns"), r.PathValue("pod"), r.PathValue("container")
	opts, err := podLogOptions(r)
	if err != nil {
		http.Error(w, `{"message": "Unable to decode query."}`, http.StatusBadRequest)
		return
	}
	wk := a.findWorker(ns, name)
	if wk == nil {
		http.Error(w, fmt.Sprintf("pod %q does not exist", name), http.StatusNotFound)
		return
	}
	pod, status := wk.snapshot()
	if !hasContainer(pod, cname) {
		http.Error(w, fmt.Sprintf("container %q not found in pod %q", cname, name), http.StatusNotFound)
		return
	}
	if status == nil {
		status = &pod.Status
	}
	id, err := logContainerID(pod.Name, status, cname, opts.Previous)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	run := wk.runByID(id)
	if run == nil {
		http.Error(w, fmt.Sprintf("container %q in pod %q: no logs on this node for %s", cname, name, id), http.StatusBadRequest)
		return
	}
	stdout, stderr := io.Writer(flushWriter{w}), io.Writer(flushWriter{w})
	switch {
	case opts.Stream == nil || *opts.Stream == v1.LogStreamAll:
	case *opts.Stream == v1.LogStreamStdout:
		stderr = io.Discard
	case *opts.Stream == v1.LogStreamStderr:
		stdout = io.Discard
	default:
		http.Error(w, fmt.Sprintf("invalid stream type %q", *opts.Stream), http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "text/plain")
	w.Header().Set("Transfer-Encoding", "chunked")
	w.WriteHeader(http.StatusOK)
	_ = logs.ReadLogs(r.Context(), run.logPath, run.id, criLogOptions(opts, time.Now()), runtimeStatus{run: run}, stdout, stderr)
}

// podLogOptions reads the query the API server sends (PodLogOptions as URL parameters).
func podLogOptions(r *http.Request) (*v1.PodLogOptions, error) {
	q := r.URL.Query()
	opts := &v1.PodLogOptions{}
	var err error
	boolean := func(key string) bool {
		v := q.Get(key)
		if v == "" {
			return false
		}
		b, e := strconv.ParseBool(v)
		if e != nil {
			err = e
		}
		return b
	}
	integer := func(key string) *int64 {
		v := q.Get(key)
		if v == "" {
			return nil
		}
		n, e := strconv.ParseInt(v, 10, 64)
		if e != nil {
			err = e
		}
		return &n
	}
	opts.Follow, opts.Previous, opts.Timestamps = boolean("follow"), boolean("previous"), boolean("timestamps")
	opts.SinceSeconds, opts.LimitBytes = integer("sinceSeconds"), integer("limitBytes")
	if tail := q.Get("tail"); tail != "" && tail != "all" { // the legacy name
		q.Set("tailLines", tail)
	}
	opts.TailLines = integer("tailLines")
	if s := q.Get("sinceTime"); s != "" {
		t, e := time.Parse(time.RFC3339, s)
		if e != nil {
			return nil, e
		}
		mt := metav1.NewTime(t)
		opts.SinceTime = &mt
	}
	if s := q.Get("stream"); s != "" {
		opts.Stream = &s
	}
	return opts, err
}

// logContainerID is the kubelet's validateContainerLogStatus.
func logContainerID(podName string, status *v1.PodStatus, name string, previous bool) (string, error) {
	var cs *v1.ContainerStatus
	for _, list := range [][]v1.ContainerStatus{status.ContainerStatuses, status.InitContainerStatuses} {
		for i := range list {
			if list[i].Name == name {
				cs = &list[i]
			}
		}
	}
	if cs == nil {
		return "", fmt.Errorf("container %q in pod %q is not available", name, podName)
	}
	last := cs.LastTerminationState.Terminated
	switch st := cs.State; {
	case previous:
		if last == nil || last.ContainerID == "" {
			return "", fmt.Errorf("previous terminated container %q in pod %q not found", name, podName)
		}
		return last.ContainerID, nil
	case st.Running != nil:
		return cs.ContainerID, nil
	case st.Terminated != nil:
		if st.Terminated.ContainerID != "" {
			return st.Terminated.ContainerID, nil
		}
		if last != nil && last.ContainerID != "" {
			return last.ContainerID, nil
		}
		return "", fmt.Errorf("container %q in pod %q is terminated", name, podName)
	case last != nil:
		if last.ContainerID == "" {
			return "", fmt.Errorf("container %q in pod %q is terminated", name, podName)
		}
		return last.ContainerID, nil
	case st.Waiting != nil:
		return "", fmt.Errorf("container %q in pod %q is waiting to start: %v", name, podName, st.Waiting.Reason)
	}
	return "", fmt.Errorf("container %q in pod %q is waiting to start - no logs yet", name, podName)
}

func hasContainer(pod *v1.Pod, name string) bool {
	for _, c := range allContainers(pod) {
		if c.Name == name {
			return true
		}
	}
	return false
}

// flushWriter sends each write at once, so that a followed log streams.
type flushWriter struct{ w http.ResponseWriter }

func (f flushWriter) Write(p []byte) (int, error) {
	n, err := f.w.Write(p)
	if fl, ok := f.w.(http.Flusher); ok {
		fl.Flush()
	}
	return n, err
}

// runtimeStatus lets the CRI log reader follow a run: while following, ReadLogs only asks
// whether the container still runs. The embedded RuntimeService is nil on purpose: nothing
// else of it is ever called.
type runtimeStatus struct {
	internalapi.RuntimeService
	run *containerRun
}

func (s runtimeStatus) ContainerStatus(_ context.Context, id string, _ bool) (*runtimeapi.ContainerStatusResponse, error) {
	state := runtimeapi.ContainerState_CONTAINER_RUNNING
	if s.run.exited() {
		state = runtimeapi.ContainerState_CONTAINER_EXITED
	}
	return &runtimeapi.ContainerStatusResponse{Status: &runtimeapi.ContainerStatus{Id: id, State: state}}, nil
}

// servePortForward hands the (SPDY or WebSocket) stream to the kubelet's own port-forward
// server code, dialing the Pod's IP from the host: the bridge reaches every Pod.
func (a *agent) servePortForward(w http.ResponseWriter, r *http.Request) {
	wk := a.findWorker(r.PathValue("ns"), r.PathValue("pod"))
	if wk == nil {
		http.Error(w, "pod does not exist", http.StatusNotFound)
		return
	}
	pod, _ := wk.snapshot()
	if uid := r.PathValue("uid"); uid != "" && types.UID(uid) != pod.UID {
		http.Error(w, "pod not found", http.StatusNotFound)
		return
	}
	opts, err := portforward.NewV4Options(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	portforward.ServePortForward(w, r, podDialer{wk}, pod.Name, string(pod.UID), opts,
		streamIdleTimeout, streamCreationTimeout, portforward.SupportedProtocols)
}

type podDialer struct{ wk *podWorker }

func (d podDialer) PortForward(ctx context.Context, name, uid string, port int32, stream io.ReadWriteCloser) error {
	defer stream.Close()
	pod, status := d.wk.snapshot()
	if status == nil || status.PodIP == "" {
		return fmt.Errorf("pod %s has no IP yet", pod.Name)
	}
	var dialer net.Dialer
	conn, err := dialer.DialContext(ctx, "tcp", net.JoinHostPort(status.PodIP, strconv.Itoa(int(port))))
	if err != nil {
		return fmt.Errorf("failed to connect to localhost:%d inside namespace of pod %s: %v", port, pod.Name, err)
	}
	defer conn.Close()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(conn, stream); conn.(*net.TCPConn).CloseWrite(); done <- struct{}{} }()
	go func() { _, _ = io.Copy(stream, conn); done <- struct{}{} }()
	select {
	case <-done:
	case <-ctx.Done():
	}
	return nil
}

// serveExec runs a command in a container's namespaces through pod-exec (no TTY: a terminal
// request gets plain pipes).
func (a *agent) serveExec(w http.ResponseWriter, r *http.Request) {
	wk := a.findWorker(r.PathValue("ns"), r.PathValue("pod"))
	if wk == nil {
		http.Error(w, "pod does not exist", http.StatusNotFound)
		return
	}
	pod, _ := wk.snapshot()
	cname := r.PathValue("container")
	if uid := r.PathValue("uid"); uid != "" && types.UID(uid) != pod.UID {
		http.Error(w, "pod not found", http.StatusNotFound)
		return
	}
	streamOpts, err := remotecommand.NewOptions(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	cmd := r.URL.Query()["command"]
	remotecommand.ServeExec(w, r, execer{a: a, wk: wk}, pod.Name, string(pod.UID), cname, cmd, streamOpts,
		streamIdleTimeout, streamCreationTimeout, remotecommand.SupportedStreamingProtocols)
}

type execer struct {
	a  *agent
	wk *podWorker
}

func (e execer) ExecInContainer(ctx context.Context, _, _, container string, cmd []string, in io.Reader, out, errw io.WriteCloser,
	_ bool, _ <-chan remotecommand.TerminalSize, _ time.Duration) error {
	run := e.wk.runningRun(container)
	if run == nil {
		return fmt.Errorf("container %q is not running", container)
	}
	if len(cmd) == 0 {
		return fmt.Errorf("no command")
	}
	c := e.a.podExecCommand(ctx, run, localArgv(cmd, e.a.cfg.Python, e.a.exe))
	c.Stdin, c.Stdout, c.Stderr = in, out, errw
	if out == nil {
		c.Stdout = io.Discard
	}
	if errw == nil {
		c.Stderr = io.Discard
	}
	err := c.Run()
	if ee, ok := err.(interface{ ExitCode() int }); ok && ee.ExitCode() > 0 {
		return utilexec.CodeExitError{Err: err, Code: ee.ExitCode()}
	}
	return err
}
