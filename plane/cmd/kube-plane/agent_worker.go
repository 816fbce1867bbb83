package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	podutil "k8s.io/kubernetes/pkg/api/v1/pod"
)

// podWorker runs one Pod, level-triggered like the kubelet's pod workers: each sync looks at
// the Pod and its containers and does the next thing (make the sandbox and volumes, start the
// next init container, start or restart containers, kill what failed its probes), then
// reports the status if it changed. Syncs run on the worker's goroutine only, on a kick
// (Pod update, process exit, probe result) or every 10 s.
type podWorker struct {
	a      *agent
	node   *nodeAgent
	uid    types.UID
	key    string // namespace/name
	dir    string
	kickCh chan struct{}
	done   chan struct{}
	hurry  chan struct{} // closed when the Pod vanished: stop waiting out grace periods
	once   sync.Once

	mu     sync.Mutex // guards pod, gone, status and runs, which the kubelet API reads
	pod    *v1.Pod
	gone   bool
	status *v1.PodStatus
	runs   map[string]*containerRun // by container ID

	// Owned by the worker goroutine.
	adopted     bool // terminal before the agent saw it: only its deletion is handled
	sandbox     *sandbox
	podIP       string
	volumes     map[string]podVolume
	containers  map[string]*container
	initialized bool
	terminal    bool // finished: nothing will run again
	startTime   time.Time
	deadlineAt  time.Time // when activeDeadlineSeconds ends the Pod (a sync is due then)
	failReason  string    // set when the agent ended the Pod itself (DeadlineExceeded)
	failMessage string
	reported    *v1.PodStatus // the status last accepted by the API server
}

func newPodWorker(a *agent, node *nodeAgent, pod *v1.Pod) *podWorker {
	return &podWorker{
		a: a, node: node, uid: pod.UID, key: pod.Namespace + "/" + pod.Name,
		dir:    filepath.Join(a.cfg.StateDir, "pods", fmt.Sprintf("%s_%s_%s", pod.Namespace, pod.Name, pod.UID)),
		kickCh: make(chan struct{}, 1), done: make(chan struct{}), hurry: make(chan struct{}),
		pod: pod, runs: map[string]*containerRun{}, containers: map[string]*container{},
		adopted: pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed,
	}
}

func (w *podWorker) kick() {
	select {
	case w.kickCh <- struct{}{}:
	default:
	}
}

func (w *podWorker) kickAt(t time.Time) { time.AfterFunc(time.Until(t), w.kick) }

func (w *podWorker) update(pod *v1.Pod) {
	w.mu.Lock()
	w.pod = pod
	w.mu.Unlock()
	w.kick()
}

func (w *podWorker) markGone() {
	w.mu.Lock()
	w.gone = true
	w.mu.Unlock()
	w.once.Do(func() { close(w.hurry) })
	w.kick()
}

func (w *podWorker) current() (*v1.Pod, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.pod, w.gone
}

// snapshot is the Pod and the status the agent last computed (nil before the first sync).
func (w *podWorker) snapshot() (*v1.Pod, *v1.PodStatus) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.pod, w.status
}

func (w *podWorker) run() {
	defer close(w.done)
	tick := time.NewTicker(10 * time.Second)
	defer tick.Stop()
	for {
		if w.sync() {
			return
		}
		select {
		case <-w.kickCh:
		case <-tick.C:
		case <-w.a.stopping:
			pod, _ := w.current()
			w.stopAll(pod, 5*time.Second, false)
			w.release()
			return
		}
	}
}

// sync does the next thing for the Pod; it returns true when the worker is finished.
func (w *podWorker) sync() bool {
	pod, gone := w.current()
	switch {
	case gone:
		w.stopAll(pod, 0, false)
		w.finish()
		return true
	case pod.DeletionTimestamp != nil:
		w.terminate(pod)
		return true
	case w.adopted:
		return false
	case w.terminal:
		w.report(pod) // in case the final status did not get through
		return false
	}
	if w.startTime.IsZero() {
		w.startTime = time.Now()
	}
	if w.pastDeadline(pod, time.Now()) {
		w.endPastDeadline(pod)
		w.report(pod)
		return false
	}
	if w.prepare(pod) {
		w.killProbeFailures(pod)
		if w.runInit(pod) {
			for i := range pod.Spec.Containers {
				spec := &pod.Spec.Containers[i]
				w.keepRunning(pod, w.containerFor(spec), spec)
			}
		}
		if w.podDone(pod) {
			w.stopAll(pod, gracePeriod(pod.Spec.TerminationGracePeriodSeconds), false)
			w.terminal = true
			w.release()
		}
	}
	w.report(pod)
	return false
}

// The kubelet's active-deadline handler (pkg/kubelet/active_deadline.go): a Pod whose
// spec.activeDeadlineSeconds have passed since its start (status.startTime, this agent's
// first sync of it, before any image or volume) is failed with this reason and message.
const (
	deadlineReason  = "DeadlineExceeded"
	deadlineMessage = "Pod was active on the node longer than the specified deadline"
)

// activeDeadline is when a Pod started at start reaches its activeDeadlineSeconds.
func activeDeadline(pod *v1.Pod, start time.Time) (time.Time, bool) {
	if pod.Spec.ActiveDeadlineSeconds == nil || start.IsZero() {
		return time.Time{}, false
	}
	return start.Add(time.Duration(*pod.Spec.ActiveDeadlineSeconds) * time.Second), true
}

// pastDeadline says whether the Pod's active deadline has passed, and otherwise makes sure
// a sync comes when it does (the field may be lowered on a running Pod).
func (w *podWorker) pastDeadline(pod *v1.Pod, now time.Time) bool {
	end, ok := activeDeadline(pod, w.startTime)
	if !ok {
		return false
	}
	if !now.Before(end) {
		return true
	}
	if !end.Equal(w.deadlineAt) {
		w.deadlineAt = end
		w.kickAt(end)
	}
	return false
}

// endPastDeadline ends a Pod past its deadline as the kubelet does: an event, its
// containers stopped within its grace period (preStop hooks first), nothing restarted,
// and the Pod Failed with reason DeadlineExceeded.
func (w *podWorker) endPastDeadline(pod *v1.Pod) {
	w.event("", v1.EventTypeNormal, deadlineReason, deadlineMessage)
	w.failReason, w.failMessage = deadlineReason, deadlineMessage
	w.stopAll(pod, gracePeriod(pod.Spec.TerminationGracePeriodSeconds), true)
	w.terminal = true
	w.release()
}

// prepare makes the sandbox and the volumes; failures are retried on later syncs.
func (w *podWorker) prepare(pod *v1.Pod) bool {
	if w.sandbox == nil {
		var sb *sandbox
		err := os.MkdirAll(w.dir, 0o755)
		if err == nil {
			sb, err = w.a.setupSandbox(pod, w.dir)
		}
		if err != nil {
			w.event("", v1.EventTypeWarning, "FailedCreatePodSandBox", "Failed to create pod sandbox: "+err.Error())
			return false
		}
		w.sandbox, w.podIP = sb, sb.ip
	}
	if w.volumes == nil {
		vols, err := setupVolumes(pod, volumeSetup{ctx: w.a.ctx, dir: w.dir, objs: w.node, tokens: w.node, info: w.runtimeInfo(),
			hostPath: filepath.Join(w.a.cfg.StateDir, "nodes", w.node.name, "hostpath")})
		if err != nil {
			w.event("", v1.EventTypeWarning, "FailedMount", err.Error())
			return false
		}
		w.volumes = vols
	}
	return true
}

func (w *podWorker) runtimeInfo() podRuntimeInfo {
	return podRuntimeInfo{podIP: w.podIP, hostIP: w.a.cfg.BridgeIP, allocatable: w.node.allocatable}
}

func (w *podWorker) containerFor(spec *v1.Container) *container {
	c := w.containers[spec.Name]
	if c == nil {
		c = &container{name: spec.Name}
		w.containers[spec.Name] = c
	}
	return c
}

// runInit runs the init containers in order and says whether the Pod is initialized. Sidecars
// (restartPolicy Always) count once started and are kept running afterwards.
func (w *podWorker) runInit(pod *v1.Pod) bool {
	for i := range pod.Spec.InitContainers {
		spec := &pod.Spec.InitContainers[i]
		c := w.containerFor(spec)
		if podutil.IsRestartableInitContainer(spec) {
			w.keepRunning(pod, c, spec)
			if !w.initialized && !w.startedNow(c) {
				return false
			}
			continue
		}
		if w.initialized {
			continue
		}
		switch {
		case c.cur == nil:
			w.start(pod, c, spec)
			return false
		case c.running():
			return false
		case c.cur.exitCode == 0:
			continue
		case podutil.ContainerShouldRestart(*spec, pod.Spec, c.cur.exitCode):
			w.restartWithBackoff(pod, c, spec)
			return false
		default:
			return false // failed for good: podDone ends the Pod
		}
	}
	w.initialized = true
	return true
}

func (w *podWorker) startedNow(c *container) bool {
	if !c.running() {
		return false
	}
	started, _, _ := c.cur.probes.get()
	return started
}

// keepRunning starts a container that never ran and restarts one that exited, per its
// restart policy.
func (w *podWorker) keepRunning(pod *v1.Pod, c *container, spec *v1.Container) {
	switch {
	case c.cur == nil:
		w.start(pod, c, spec)
	case c.cur.exited() && podutil.ContainerShouldRestart(*spec, pod.Spec, c.cur.exitCode):
		w.restartWithBackoff(pod, c, spec)
	}
}

// The kubelet's crash-loop back-off: 10 s doubling to 5 min, counted from the exit; it
// starts over once a container ran for 10 min.
const (
	initialBackoff = 10 * time.Second
	maxBackoff     = 300 * time.Second
)

// inBackoff says whether the exited container must wait, and until when.
func (c *container) inBackoff(now time.Time) (bool, time.Time) {
	fin := c.cur.finishedAt
	if c.backoff == 0 || fin.Sub(c.backoffAt) > 2*maxBackoff {
		return false, time.Time{}
	}
	return now.Sub(fin) < c.backoff, fin.Add(c.backoff)
}

func (c *container) nextBackoff(now time.Time) {
	if c.backoff == 0 || c.cur.finishedAt.Sub(c.backoffAt) > 2*maxBackoff {
		c.backoff = initialBackoff
	} else {
		c.backoff = min(2*c.backoff, maxBackoff)
	}
	c.backoffAt = now
}

func (w *podWorker) restartWithBackoff(pod *v1.Pod, c *container, spec *v1.Container) {
	now := time.Now()
	if wait, until := c.inBackoff(now); wait {
		desc := fmt.Sprintf("%s_%s(%s)", pod.Name, pod.Namespace, pod.UID)
		c.waiting = &v1.ContainerStateWaiting{Reason: "CrashLoopBackOff",
			Message: fmt.Sprintf("back-off %s restarting failed container=%s pod=%s", c.backoff, c.name, desc)}
		w.event(c.name, v1.EventTypeWarning, "BackOff", fmt.Sprintf("Back-off restarting failed container %s in pod %s", c.name, desc))
		w.kickAt(until)
		return
	}
	c.nextBackoff(now)
	w.start(pod, c, spec)
}

// configError is a CreateContainerConfigError (env that names a missing ConfigMap or key).
type configError struct{ error }

func (w *podWorker) start(pod *v1.Pod, c *container, spec *v1.Container) {
	run, es, err := w.createRun(pod, c, spec)
	if err == nil {
		err = w.a.launch(run, es, w.key, c.name, spec.TerminationMessagePolicy, w.kick)
	}
	if err != nil {
		reason := "CreateContainerError"
		if errors.As(err, new(configError)) {
			reason = "CreateContainerConfigError"
		}
		c.waiting = &v1.ContainerStateWaiting{Reason: reason, Message: err.Error()}
		w.event(c.name, v1.EventTypeWarning, "Failed", "Error: "+err.Error())
		return
	}
	if c.cur != nil {
		c.prev, c.restarts = c.cur, c.restarts+1
	}
	c.cur, c.waiting = run, nil
	w.mu.Lock()
	w.runs[run.id] = run
	w.mu.Unlock()
	w.event(c.name, v1.EventTypeNormal, "Pulled", fmt.Sprintf("servebook node agent: image %q not pulled; runs %s", spec.Image, describeArgv(es.Argv)))
	w.event(c.name, v1.EventTypeNormal, "Created", "Container created")
	w.event(c.name, v1.EventTypeNormal, "Started", "Container started")
	w.startProbes(spec, run, probeTarget{podIP: w.podIP, spec: spec, run: run, execFn: w.a.execInRun(run)})
}

// createRun resolves everything a container's process needs; nothing runs yet.
func (w *podWorker) createRun(pod *v1.Pod, c *container, spec *v1.Container) (*containerRun, *execSpec, error) {
	svcEnv := serviceEnvFor(w.a.services.list(), pod.Namespace, pod.Spec.EnableServiceLinks == nil || *pod.Spec.EnableServiceLinks)
	env, err := containerEnv(pod, spec, w.runtimeInfo(), svcEnv, w.node)
	if err != nil {
		return nil, nil, configError{err}
	}
	argv, err := containerArgv(spec.Image, expandAll(spec.Command, env), expandAll(spec.Args, env))
	if err != nil {
		return nil, nil, err
	}
	argv = localArgv(argv, w.a.cfg.Python, w.a.exe)
	if err := w.allocateGPUs(c, spec); err != nil {
		return nil, nil, err
	}
	dir := filepath.Join(w.dir, "containers", c.name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, nil, err
	}
	run, err := newContainerRun(dir)
	if err != nil {
		return nil, nil, err
	}
	mounts, err := containerMounts(spec, w.volumes, w.sandbox, run.termLog, env)
	if err == nil {
		err = w.ensureMountTargets(mounts)
	}
	if err != nil {
		return nil, nil, err
	}
	full := w.processEnv(env, c)
	if _, err := lookPath(argv[0], full["PATH"], existsInMounts(mounts)); err != nil {
		return nil, nil, errCannotRun{err.Error()}
	}
	workDir := spec.WorkingDir
	if workDir == "" {
		workDir = "/"
	}
	if err := w.ensureWorkDir(workDir, mounts); err != nil {
		return nil, nil, err
	}
	return run, &execSpec{NetNS: w.sandbox.netnsPath(), Hostname: w.sandbox.hostname, Mounts: mounts,
		WorkDir: workDir, Argv: argv, Env: envList(full)}, nil
}

// processEnv puts what an image would provide (PATH, HOME, HOSTNAME) under the container's
// variables, and the GPU indices (as NVIDIA's device plugin would) over them.
func (w *podWorker) processEnv(env map[string]string, c *container) map[string]string {
	hostname := w.sandbox.hostname
	if hostname == "" {
		hostname, _ = os.Hostname()
	}
	full := map[string]string{"PATH": w.a.podPATH, "HOME": "/root", "HOSTNAME": hostname}
	for k, v := range env {
		full[k] = v
	}
	if len(c.gpus) > 0 {
		ids := make([]string, len(c.gpus))
		for i, g := range c.gpus {
			ids[i] = strconv.Itoa(g)
		}
		full["NVIDIA_VISIBLE_DEVICES"] = strings.Join(ids, ",")
	}
	return full
}

// ensureMountTargets creates missing mount points on the host (a file for a file source).
func (w *podWorker) ensureMountTargets(mounts []bindMount) error {
	for _, m := range mounts {
		fi, err := os.Stat(m.Source)
		if err != nil {
			return err
		}
		if err := w.a.mounts.ensure(m.Target, !fi.IsDir()); err != nil {
			return err
		}
	}
	return nil
}

// ensureWorkDir creates a missing working directory as a runtime does: inside the volume when
// it lies in one, otherwise on the host (removed again on exit if left empty).
func (w *podWorker) ensureWorkDir(dir string, mounts []bindMount) error {
	if host := hostPathIn(mounts, dir); host != dir {
		return os.MkdirAll(host, 0o755)
	}
	return w.a.mounts.ensure(dir, false)
}

// hostPathIn is where path p of the container lies on the host, through its mounts.
func hostPathIn(mounts []bindMount, p string) string {
	best := -1
	for i, m := range mounts {
		if (p == m.Target || strings.HasPrefix(p, m.Target+"/")) && (best < 0 || len(m.Target) > len(mounts[best].Target)) {
			best = i
		}
	}
	if best < 0 {
		return p
	}
	return mounts[best].Source + strings.TrimPrefix(p, mounts[best].Target)
}

// existsInMounts checks for an executable as the container would see it.
func existsInMounts(mounts []bindMount) func(string) bool {
	return func(p string) bool { return isExecutable(hostPathIn(mounts, p)) }
}

func (w *podWorker) allocateGPUs(c *container, spec *v1.Container) error {
	n := gpuRequest(spec)
	if n == 0 || c.gpus != nil {
		return nil
	}
	ids, err := w.node.gpus.allocate(string(w.uid)+"/"+c.name, n)
	c.gpus = ids
	return err
}

// killProbeFailures kills containers whose liveness or startup probe failed; they are then
// restarted (or not) by their restart policy like any exited container.
func (w *podWorker) killProbeFailures(pod *v1.Pod) {
	for _, spec := range allContainers(pod) {
		c := w.containers[spec.Name]
		if c == nil || !c.running() || c.cur.killing {
			continue
		}
		if _, _, failed := c.cur.probes.get(); failed != "" {
			c.cur.killing = true
			w.event(c.name, v1.EventTypeNormal, "Killing", failed)
			grace := gracePeriod(pod.Spec.TerminationGracePeriodSeconds)
			if p := failedProbe(spec); p != nil && p.TerminationGracePeriodSeconds != nil {
				grace = gracePeriod(p.TerminationGracePeriodSeconds)
			}
			go c.cur.kill(grace, w.hurry)
		}
	}
}

func failedProbe(spec *v1.Container) *v1.Probe {
	if spec.LivenessProbe != nil {
		return spec.LivenessProbe
	}
	return spec.StartupProbe
}

// podDone: no regular container runs or will run again, or an init container failed for good.
func (w *podWorker) podDone(pod *v1.Pod) bool {
	for i := range pod.Spec.InitContainers {
		spec := &pod.Spec.InitContainers[i]
		c := w.containers[spec.Name]
		if c != nil && !podutil.IsRestartableInitContainer(spec) && c.cur != nil && c.cur.exited() &&
			c.cur.exitCode != 0 && !podutil.ContainerShouldRestart(*spec, pod.Spec, c.cur.exitCode) {
			return true
		}
	}
	if !w.initialized {
		return false
	}
	for i := range pod.Spec.Containers {
		spec := &pod.Spec.Containers[i]
		c := w.containers[spec.Name]
		if c == nil || c.cur == nil || !c.cur.exited() || podutil.ContainerShouldRestart(*spec, pod.Spec, c.cur.exitCode) {
			return false
		}
	}
	return true
}

// stopAll stops every running container within grace: the regular ones (and init containers)
// first, then the sidecars, as the kubelet orders it. With hooks, preStop handlers run first.
func (w *podWorker) stopAll(pod *v1.Pod, grace time.Duration, hooks bool) {
	deadline := time.Now().Add(grace)
	for _, sidecars := range []bool{false, true} {
		var wg sync.WaitGroup
		for _, spec := range allContainers(pod) {
			c := w.containers[spec.Name]
			if c == nil || !c.running() || podutil.IsRestartableInitContainer(spec) != sidecars {
				continue
			}
			wg.Add(1)
			go func(spec *v1.Container, run *containerRun) {
				defer wg.Done()
				w.stopRun(spec, run, deadline, hooks)
			}(spec, c.cur)
		}
		wg.Wait()
	}
}

func (w *podWorker) stopRun(spec *v1.Container, run *containerRun, deadline time.Time, hooks bool) {
	w.event(spec.Name, v1.EventTypeNormal, "Killing", "Stopping container "+spec.Name)
	if hooks && spec.Lifecycle != nil && spec.Lifecycle.PreStop != nil && time.Until(deadline) > 0 {
		t := probeTarget{podIP: w.podIP, spec: spec, run: run, execFn: w.a.execInRun(run)}
		if ok, msg := runHandler(w.a.ctx, *spec.Lifecycle.PreStop, time.Until(deadline), t); !ok {
			w.event(spec.Name, v1.EventTypeWarning, "FailedPreStopHook", "PreStopHook failed: "+msg)
		}
	}
	run.kill(time.Until(deadline), w.hurry)
}

// terminate finishes a graceful deletion as the kubelet does: stop the containers within the
// grace period, report the final status, clean up, then delete the Pod for good.
func (w *podWorker) terminate(pod *v1.Pod) {
	grace := gracePeriod(pod.Spec.TerminationGracePeriodSeconds)
	if pod.DeletionGracePeriodSeconds != nil {
		grace = gracePeriod(pod.DeletionGracePeriodSeconds)
	}
	w.stopAll(pod, grace, true)
	w.terminal = true
	w.report(pod)
	w.finish()
	zero := int64(0)
	err := w.node.client.CoreV1().Pods(pod.Namespace).Delete(w.a.ctx, pod.Name,
		metav1.DeleteOptions{GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &w.uid}})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		log.Printf("node-agent: delete pod %s: %v", w.key, err)
	}
}

// release frees what a finished Pod held: its network and GPUs. Logs stay until deletion.
func (w *podWorker) release() {
	if w.sandbox != nil {
		w.a.teardownSandbox(w.sandbox)
		w.sandbox = nil
	}
	w.node.gpus.release(string(w.uid) + "/")
}

// finish releases everything and forgets the Pod.
func (w *podWorker) finish() {
	w.release()
	_ = os.RemoveAll(w.dir)
	w.a.workerDone(w)
}

// report sends the status when it changed (a merge patch of status, with the Pod's UID as a
// precondition, as the kubelet's status manager does).
func (w *podWorker) report(pod *v1.Pod) {
	if w.adopted {
		return
	}
	old := pod.Status
	if w.reported != nil {
		old = *w.reported
	}
	st := computePodStatus(pod, old, w.view(), time.Now())
	w.mu.Lock()
	w.status = &st
	w.mu.Unlock()
	if w.reported != nil && apiequality.Semantic.DeepEqual(*w.reported, st) {
		return
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"uid": pod.UID}, "status": st})
	if err != nil {
		log.Printf("node-agent: pod %s status: %v", w.key, err)
		return
	}
	_, err = w.node.client.CoreV1().Pods(pod.Namespace).Patch(w.a.ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{}, "status")
	switch {
	case err == nil:
		w.reported = &st
	case apierrors.IsNotFound(err) || apierrors.IsConflict(err): // gone, or a new Pod of the same name
		w.markGone()
	case w.a.ctx.Err() == nil:
		log.Printf("node-agent: pod %s status: %v", w.key, err) // retried on the next sync
	}
}

func (w *podWorker) view() podView {
	v := podView{HostIP: w.a.cfg.BridgeIP, StartTime: w.startTime, Terminal: w.terminal,
		FailReason: w.failReason, FailMessage: w.failMessage,
		SandboxReady: w.sandbox != nil && w.volumes != nil, Containers: map[string]containerView{}}
	if v.SandboxReady || w.terminal {
		v.PodIP = w.podIP
	}
	for name, c := range w.containers {
		cv := containerView{Waiting: c.waiting, Restarts: c.restarts}
		if c.cur != nil {
			cv.Current = c.cur.view()
			if !cv.Current.Exited {
				cv.Started, cv.Ready, _ = c.cur.probes.get()
			}
		}
		if c.prev != nil {
			cv.Previous = c.prev.view()
		}
		v.Containers[name] = cv
	}
	return v
}

// event records an event on the Pod, or on one of its containers when name is set.
func (w *podWorker) event(name, typ, reason, msg string) {
	pod, _ := w.current()
	ref := &v1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: pod.Namespace, Name: pod.Name,
		UID: pod.UID, ResourceVersion: pod.ResourceVersion}
	if name != "" {
		ref.FieldPath = "spec.containers{" + name + "}"
		for _, c := range pod.Spec.InitContainers {
			if c.Name == name {
				ref.FieldPath = "spec.initContainers{" + name + "}"
			}
		}
	}
	w.node.recorder.Event(ref, typ, reason, msg)
}

func allContainers(pod *v1.Pod) []*v1.Container {
	var out []*v1.Container
	for i := range pod.Spec.InitContainers {
		out = append(out, &pod.Spec.InitContainers[i])
	}
	for i := range pod.Spec.Containers {
		out = append(out, &pod.Spec.Containers[i])
	}
	return out
}

func gracePeriod(s *int64) time.Duration {
	if s == nil {
		return 30 * time.Second
	}
	return time.Duration(*s) * time.Second
}
