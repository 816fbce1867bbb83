package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Probes and lifecycle handlers, as the kubelet's prober runs them: one loop per probe of a
// running container, thresholds counted over consecutive results.

// probeState is what a run's probes have found; the worker reads it, the loops write it.
type probeState struct {
	mu      sync.Mutex
	started bool   // the startup probe passed, or there is none
	ready   bool   // the readiness probe passes, or there is none
	failed  string // set when liveness or startup failed past its threshold: the Killing message
}

func (p *probeState) get() (started, ready bool, failed string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.started, p.ready, p.failed
}

type probeKind string

const (
	startupProbe   probeKind = "Startup"
	readinessProbe probeKind = "Readiness"
	livenessProbe  probeKind = "Liveness"
)

// probeTarget is what a handler runs against.
type probeTarget struct {
	podIP  string
	spec   *v1.Container
	run    *containerRun
	execFn func(ctx context.Context, argv []string) ([]byte, error)
}

// startProbes starts the probe loops of a new run; they end when the run exits.
func (w *podWorker) startProbes(spec *v1.Container, run *containerRun, t probeTarget) {
	ps := &probeState{started: spec.StartupProbe == nil, ready: spec.ReadinessProbe == nil}
	run.probes = ps
	ctx, cancel := context.WithCancel(w.a.ctx)
	go func() {
		<-run.done
		cancel()
	}()
	for kind, p := range map[probeKind]*v1.Probe{startupProbe: spec.StartupProbe, readinessProbe: spec.ReadinessProbe, livenessProbe: spec.LivenessProbe} {
		if p != nil {
			go w.probeLoop(ctx, kind, p, ps, t)
		}
	}
}

func (w *podWorker) probeLoop(ctx context.Context, kind probeKind, p *v1.Probe, ps *probeState, t probeTarget) {
	if !sleepCtx(ctx, time.Until(t.run.startedAt.Add(seconds(p.InitialDelaySeconds, 0)))) {
		return
	}
	ticker := time.NewTicker(seconds(p.PeriodSeconds, 10))
	defer ticker.Stop()
	var last *bool
	count := 0
	for {
		if started, _, _ := ps.get(); kind == startupProbe || started {
			ok, msg := runHandler(ctx, handlerOf(p), seconds(p.TimeoutSeconds, 1), t)
			if ctx.Err() != nil {
				return
			}
			if !ok {
				w.event(t.spec.Name, v1.EventTypeWarning, "Unhealthy", fmt.Sprintf("%s probe failed: %s", kind, msg))
			}
			if last == nil || *last != ok {
				last, count = &ok, 0
			}
			count++
			if w.applyProbeResult(kind, p, ps, ok, count, t.spec.Name) {
				return
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

// applyProbeResult changes the state once a result has repeated threshold times, and says
// whether the loop is over (startup passed, or the container is to be killed).
func (w *podWorker) applyProbeResult(kind probeKind, p *v1.Probe, ps *probeState, ok bool, count int, name string) bool {
	if ok && count < int(max(p.SuccessThreshold, 1)) || !ok && count < int(max(p.FailureThreshold, 1)) {
		return false
	}
	ps.mu.Lock()
	changed, done := false, false
	switch {
	case kind == readinessProbe:
		changed, ps.ready = ps.ready != ok, ok
	case ok && kind == startupProbe:
		changed, done, ps.started = true, true, true
	case !ok:
		changed, done = true, true
		ps.failed = fmt.Sprintf("Container %s failed %s probe, will be restarted", name, strings.ToLower(string(kind)))
	}
	ps.mu.Unlock()
	if changed {
		w.kick()
	}
	return done
}

func handlerOf(p *v1.Probe) v1.LifecycleHandler {
	return v1.LifecycleHandler{Exec: p.Exec, HTTPGet: p.HTTPGet, TCPSocket: p.TCPSocket}
}

// runHandler runs a probe's or hook's action and returns success and the failure's words.
func runHandler(ctx context.Context, h v1.LifecycleHandler, timeout time.Duration, t probeTarget) (bool, string) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	switch {
	case h.Exec != nil:
		out, err := t.execFn(ctx, h.Exec.Command)
		if ctx.Err() == context.DeadlineExceeded {
			return false, fmt.Sprintf("command %q timed out", strings.Join(h.Exec.Command, " "))
		}
		if err != nil {
			return false, string(out) // the kubelet's message is the command's output, even when empty
		}
		return true, ""
	case h.HTTPGet != nil:
		return httpProbe(ctx, h.HTTPGet, t)
	case h.TCPSocket != nil:
		port, err := resolvePort(h.TCPSocket.Port, t.spec)
		if err != nil {
			return false, err.Error()
		}
		host := h.TCPSocket.Host
		if host == "" {
			host = t.podIP
		}
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			return false, err.Error()
		}
		conn.Close()
		return true, ""
	case h.Sleep != nil:
		sleepCtx(ctx, time.Duration(h.Sleep.Seconds)*time.Second)
		return true, ""
	}
	return false, "servebook's node agent does not run gRPC probes"
}

// probeTransport: no proxy from the environment, no certificate checks (like the kubelet's),
// no connection reuse.
var probeTransport = &http.Transport{
	TLSClientConfig:   &tls.Config{InsecureSkipVerify: true},
	DisableKeepAlives: true,
	Proxy:             nil,
}

func httpProbe(ctx context.Context, h *v1.HTTPGetAction, t probeTarget) (bool, string) {
	port, err := resolvePort(h.Port, t.spec)
	if err != nil {
		return false, err.Error()
	}
	host := h.Host
	if host == "" {
		host = t.podIP
	}
	u, err := url.Parse(h.Path)
	if err != nil {
		return false, err.Error()
	}
	u.Scheme = strings.ToLower(string(h.Scheme))
	if u.Scheme == "" {
		u.Scheme = "http"
	}
	u.Host = net.JoinHostPort(host, strconv.Itoa(port))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return false, err.Error()
	}
	req.Header.Set("User-Agent", "kube-probe/1.37")
	req.Header.Set("Accept", "*/*")
	for _, hdr := range h.HTTPHeaders {
		if strings.EqualFold(hdr.Name, "Host") {
			req.Host = hdr.Value
		} else {
			req.Header.Add(hdr.Name, hdr.Value)
		}
	}
	client := &http.Client{Transport: probeTransport, CheckRedirect: sameHostRedirects}
	resp, err := client.Do(req)
	if err != nil {
		return false, err.Error()
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 10*1024))
	if resp.StatusCode >= 200 && resp.StatusCode < 400 {
		return true, ""
	}
	return false, fmt.Sprintf("HTTP probe failed with statuscode: %d", resp.StatusCode)
}

// sameHostRedirects follows redirects on the same host only; another host's redirect counts
// as the (successful, 3xx) answer, as in the kubelet.
func sameHostRedirects(req *http.Request, via []*http.Request) error {
	if len(via) >= 10 {
		return errors.New("stopped after 10 redirects")
	}
	if req.URL.Hostname() != via[0].URL.Hostname() {
		return http.ErrUseLastResponse
	}
	return nil
}

// resolvePort turns a probe's port (a number or the name of a container port) into a number.
func resolvePort(port intstr.IntOrString, spec *v1.Container) (int, error) {
	if port.Type == intstr.Int {
		return port.IntValue(), nil
	}
	for _, p := range spec.Ports {
		if p.Name == port.StrVal {
			return int(p.ContainerPort), nil
		}
	}
	if n, err := strconv.Atoi(port.StrVal); err == nil {
		return n, nil
	}
	return 0, fmt.Errorf("couldn't find port: %v in container %s", port.StrVal, spec.Name)
}

func seconds(v, def int32) time.Duration {
	if v <= 0 {
		v = def
	}
	return time.Duration(v) * time.Second
}

// sleepCtx sleeps for d unless ctx ends first; it says whether the whole time passed.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
